"""Presets: each loads, runs on a seeded image, and round-trips through albumentations' YAML."""

import numpy as np
import pytest

from pipeprof.data.augment import A, load_preset, output_dtype, stage_names
from pipeprof.presets import available, preset_path


@pytest.fixture
def image():
    return np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)


@pytest.mark.parametrize(
    "name, dtype, stages",
    [
        ("light", "uint8", ["RandomCrop", "HorizontalFlip", "ToTensorV2"]),
        ("standard", "float32", ["RandomResizedCrop", "HorizontalFlip", "Normalize", "ToTensorV2"]),
        (
            "heavy",
            "float32",
            [
                "RandomResizedCrop",
                "HorizontalFlip",
                "ColorJitter",
                "Affine",
                "GaussianBlur",
                "GaussNoise",
                "Normalize",
                "ToTensorV2",
            ],
        ),
    ],
)
def test_preset_runs_and_round_trips(name, dtype, stages, image, tmp_path):
    compose = load_preset(name)
    compose.set_random_seed(7)
    out = compose(image=image)["image"]
    assert tuple(out.shape) == (3, 224, 224) and output_dtype(compose) == dtype
    assert stage_names(compose) == stages
    saved = tmp_path / f"{name}.yaml"
    A.save(compose, str(saved), data_format="yaml")
    again = A.load(str(saved), data_format="yaml")
    assert A.to_dict(again) == A.to_dict(compose)
    again.set_random_seed(7)
    assert np.array_equal(np.asarray(again(image=image)["image"]), np.asarray(out))


def test_size_override_crops_for_inception(image):
    for name in available():
        assert tuple(load_preset(name, size=299)(image=image)["image"].shape) == (3, 299, 299)


def test_user_preset_file_and_unknown_name(tmp_path):
    path = tmp_path / "mine.yaml"
    A.save(A.Compose([A.CenterCrop(64, 64)]), str(path), data_format="yaml")
    assert preset_path(str(path)) == path
    with pytest.raises(ValueError, match="available: heavy, light, standard"):
        preset_path("nope")
