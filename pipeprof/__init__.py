"""pipeprof: is training CPU-, I/O- or GPU-bound, and what to do about it.

Python API::

    import pipeprof
    result = pipeprof.profile(my_dataset, model="resnet50", batch_size=64, num_workers=[0, 2, 4])
    result.trials            # pandas DataFrame, one row per trial
    pipeprof.run("configs/default.yaml")
    pipeprof.load_run("out/run-20261129-141500")
"""

from __future__ import annotations

from pipeprof.measure.confounders import quiet_albumentations

from ._version import __version__  # noqa: F401 - the package's public version

quiet_albumentations()


def run(config=None, overrides=(), **kwargs):
    """Run an experiment file (or the defaults) with ``section.key=value`` overrides; returns a Run."""
    from pipeprof.orchestrate.runner import execute

    from .config import RunConfig, load

    cfg = config if isinstance(config, RunConfig) else load(config, list(overrides))
    return execute(cfg, **kwargs)


def profile(
    dataset=None,
    model="auto",
    batch_size=None,
    num_workers=None,
    precision=None,
    *,
    mode=None,
    trials=None,
    measure=None,
    out_dir=None,
    name=None,
    log=print,
    loss_fn=None,
    threads=None,
    loader=None,
    config=None,
    **sections,
):
    """Profile ``dataset`` (a map-style Dataset or an IterableDataset of ``(CHW tensor, label)``;
    None: the synthetic one) feeding ``model`` (an ``nn.Module``, a model name, or "auto") over
    worker counts.

    ``loader``: instead of ``dataset``, your own DataLoader (any iterable of batches: a WebLoader,
    litdata, a custom sampler/collate) as ``fn(num_workers)``, called per trial with the swept count.
    Batches: a dict with 'image'/'label' (or 'images'/'labels') or a tuple (images, labels, ...);
    the first fixes the batch size (``batch_size`` may only repeat it).

    ``config``: any part of a config file as a dict in the YAML's shape, e.g. ``config={"model":
    {"num_classes": 10}, "loader": {"pin_memory": False}}`` (``model`` and ``loader`` are this function's
    own arguments, so those sections come this way). Other sections may also come as keywords
    (``data={...}``, ``device="cpu"``; ``measure`` takes MeasureConfig fields). The shortcuts (``model``,
    ``batch_size``, ``num_workers``, ``precision``, ``mode``, ``trials``, ``threads``, ``out_dir``,
    ``name``) override the fields they stand for when given.

    Returns a :class:`pipeprof.results.Run`; ``.trials`` is a DataFrame whose
    metric columns carry their units (``samples_per_s``, ``data_wait_frac``...).
    ``loss_fn(raw model output, labels) -> scalar tensor`` replaces the default cross-entropy
    (which needs labels in ``[0, model outputs)``). ``threads``: the CPU step's intra-op threads
    (``model.threads``; default: the cores the workers leave).
    """
    from pipeprof.orchestrate.runner import execute

    from .config import build

    if dataset is not None and loader is not None:
        raise ValueError("profile(): pass dataset= or loader=, not both (the loader factory builds its own dataset)")
    models = {}
    if model is not None and not isinstance(model, str):
        import copy

        from .models import USER_PREFIX

        template, model = model, f"{USER_PREFIX}{type(model).__name__}"
        models[model] = lambda: copy.deepcopy(template)
    shortcuts = {
        "name": name,
        "out_dir": out_dir,
        "trials": trials,
        "model.name": None if model == "auto" else model,
        "model.precision": precision,
        "model.mode": mode,
        "model.threads": threads,
        "loader.num_workers": num_workers,
        "loader.batch_size": batch_size,
    }
    raw = _profile_config(config, sections | ({"measure": measure} if measure else {}), shortcuts)
    cfg = build({"name": "profile"} | raw, origin="profile() arguments")
    return execute(cfg, user_dataset=dataset, models=models, log=log, loss_fn=loss_fn, user_loader=loader)


def _profile_config(config, sections: dict, shortcuts: dict) -> dict:
    """``config``, then whole sections given by keyword (merged field by field into the config's), then
    each shortcut that was given (``"section.field"`` or a top-level field)."""
    import copy

    from .config import ConfigError

    raw = copy.deepcopy(config or {})
    if not isinstance(raw, dict):
        raise ConfigError(f"profile(config=...): expected a dict of config sections, got {type(raw).__name__}")
    for key, value in sections.items():
        both = isinstance(raw.get(key), dict) and isinstance(value, dict)
        raw[key] = {**raw[key], **value} if both else value
    for dotted, value in shortcuts.items():
        section, _, key = dotted.rpartition(".")
        if value is None:
            continue
        if section and not isinstance(raw.setdefault(section, {}), dict):
            raise ConfigError(f"profile(config=...): {section} must be a dict of fields, got {raw[section]!r}")
        (raw[section] if section else raw)[key] = value
    return raw


def load_run(path):
    """Read a run folder back (see ``pipeprof.results``)."""
    from .results import load_run as _load

    return _load(path)
