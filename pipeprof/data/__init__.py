"""Where samples come from and how they become tensors.

- ``sources/``:  the storage a sample's bytes come from (files, memory, shards, url, throttled)
- ``decode``:    bytes → 8-bit RGB arrays (Pillow or OpenCV)
- ``augment``:   the albumentations presets, loaded from ``augmentations/*.yaml``
- ``gpu_augment``: a preset on the GPU (``augment.device: cuda``): nvJPEG decode and the transforms'
  torchvision counterparts, one table, each on the whole batch (per-sample forms kept as the reference);
  the device is a parameter (CPU in tests)
- ``gpu_decode``: the GPU pipeline's JPEG decoders (``augment.gpu_decoder``: torchvision's nvJPEG,
  TorchCodec, nvImageCodec's hardware engines), each refused with its reason where it cannot run
- ``gpu_kernels``: the GPU pipeline's own Triton kernels (RandomResizedCrop's resize, ColorJitter), each
  one or two launches a batch, the torch forms kept where they cannot run
- ``dataset``:   the map-style Dataset running read → decode → augment with per-stage timing
- ``encoded``:   the Dataset whose workers only read bytes, for the GPU pipeline
- ``synthetic``: the cached ImageNet-like JPEG dataset the default run makes
- ``prepare``, ``cache``: building the sources of a run; page-cache state and whether data fits
- ``check``:     ``pipeprof check-data``, unreadable or outsize images found from their headers
- ``user_samples``: a user's Dataset checked on its first sample and batch (form, dtype, layout, size)
- ``user_pipeline``: a user's Dataset read for the changes ``watch --tune`` tries on it (its transform, its
  files), and the changes made to a copy of it there (uint8 batches, the other decoder)
- ``user_gpu_pipeline``: the GPU path on a user's Dataset: its files' bytes through the workers, decoded and
  augmented on the GPU through ``gpu_augment``'s table
- ``user_actions``: those changes by action id: what each says on a dataset and what to write for it
- ``ray_engine``: the pipeline on Ray Data's CPU actors (``data.engine: ray``); the only module that imports ray

May import: the nouns at the top of the package (``config``, ``env``, ``presets``, ``schema``).
"""
