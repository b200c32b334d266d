"""Where samples come from and how they become tensors.

- ``sources/``:  the storage a sample's bytes come from (files, memory, shards, url, throttled)
- ``decode``:    bytes → 8-bit RGB arrays (Pillow or OpenCV)
- ``augment``:   the albumentations presets, loaded from ``augmentations/*.yaml``
- ``dataset``:   the map-style Dataset running read → decode → augment with per-stage timing
- ``synthetic``: the cached ImageNet-like JPEG dataset the default run makes
- ``prepare``, ``cache``: building the sources of a run; page-cache state and whether data fits
- ``check``:     ``pipeprof check-data``, unreadable or outsize images found from their headers

May import: the nouns at the top of the package (``config``, ``env``, ``presets``, ``schema``).
"""
