"""Config validation: every bad field is named, with what is allowed, before anything runs."""

import pytest

from pipeprof import config as C
from pipeprof.cli import main


def error_of(raw) -> str:
    with pytest.raises(C.ConfigError) as exc:
        C.build(raw)
    return str(exc.value)


def test_defaults_validate_and_resolve_for_a_cpu_machine():
    cfg = C.resolve(C.build({}), cuda=False, bf16_ok=False, usable_cores=2)
    assert cfg.device == "cpu" and cfg.model.name == ["mobilenet_v3_small"] and cfg.model.precision == ["fp32"]
    assert cfg.loader.num_workers == [0, 1, 2] and cfg.loader.batch_size == [16] and cfg.loader.pin_memory is False


def test_resolve_for_a_gpu_machine_picks_resnet50_and_bf16():
    cfg = C.resolve(C.build({}), cuda=True, bf16_ok=True, usable_cores=16)
    assert cfg.model.name == ["resnet50"] and cfg.model.precision == ["bf16"] and cfg.model.channels_last
    assert cfg.loader.num_workers == [0, 1, 2, 4, 8, 16] and cfg.loader.pin_memory


@pytest.mark.parametrize(
    "raw, field, hint",
    [
        ({"loader": {"num_workres": [1]}}, "loader.num_workres", "unknown key"),
        ({"loader": {"num_workers": [0, -2]}}, "loader.num_workers.1", "greater than or equal to 0"),
        ({"loader": {"batch_size": "big"}}, "loader.batch_size.0", "integer"),
        ({"model": {"name": "resnet9000"}}, "model.name", "resnet50"),
        ({"model": {"precision": "fp8"}}, "model.precision.0", "'bf16'"),
        ({"augment": {"preset": "extreme"}}, "augment.preset", "heavy"),
        ({"data": {"decoder": "turbo"}}, "data.decoder", "'cv2'"),
        ({"measure": {"windows": 1}}, "measure.windows", "greater than or equal to 2"),
    ],
)
def test_bad_fields_are_named_with_allowed_values(raw, field, hint):
    msg = error_of(raw)
    assert field in msg and hint in msg


def test_scalars_become_one_point_axes():
    cfg = C.build({"loader": {"num_workers": 4}, "model": {"name": "resnet18", "precision": "bf16"}})
    assert cfg.loader.num_workers == [4] and cfg.model.name == ["resnet18"] and cfg.model.precision == ["bf16"]


def test_set_overrides_parse_yaml_values(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("loader:\n  batch_size: 32\n")
    cfg = C.load(path, ["loader.num_workers=[0,2,4]", "measure.window_s=0.5", "augment.preset=heavy"])
    assert cfg.loader.num_workers == [0, 2, 4] and cfg.loader.batch_size == [32]
    assert cfg.measure.window_s == 0.5 and cfg.augment.preset == ["heavy"]


def test_fp16_on_cpu_is_refused_with_the_cpu_choices():
    with pytest.raises(C.ConfigError, match="allowed on CPU: fp32, bf16"):
        C.resolve(C.build({"model": {"precision": "fp16"}}), cuda=False, bf16_ok=False, usable_cores=2)


def test_cli_exits_2_naming_the_field(capsys, tmp_path):
    assert main(["run", "--set", "loader.num_workers=[-1]", "--set", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "loader.num_workers.0" in err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_cli_missing_config_file_exits_2(capsys):
    assert main(["run", "no/such/file.yaml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_shipped_configs_validate():
    from pathlib import Path

    files = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert files, "configs/ should ship experiment files"
    for f in files:
        assert isinstance(C.load(f), C.RunConfig)
