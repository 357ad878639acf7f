"""Tests of trainopt.config: loading, every error naming its dotted field, building from a
config."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.config.training import ConfigError, build_optimizer, load_config, validate_config
from trainopt.data import path
from trainopt.models import digits_loaders, digits_mlp
from trainopt.schedules.registry import (
    PolynomialDecaySchedule,
    build_scheduler,
    register_scheduler,
)

DATA = path(".")

GOOD = {
    "training": {
        "optimizer": {"type": "adamw", "lr": 1e-3, "weight_decay": 0.01},
        "scheduler": {
            "type": "cosine_annealing",
            "warmup_steps": 10,
            "total_steps": 100,
            "min_lr": 1e-5,
        },
    }
}


def with_field(path: str, value, base=GOOD) -> dict:
    """A copy of ``base`` with the dotted field set (or removed when value is ...)."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_page_config_loads_and_trains_the_digits_mlp_for_a_few_steps():
    config = load_config(DATA / "scheduler_cosine.yaml")
    model = digits_mlp()
    optimizer = build_optimizer(model.parameters(), config)
    scheduler = build_scheduler(optimizer, config)
    train, _ = digits_loaders(batch_size=64)
    losses = []
    for _ in range(3):  # 3 epochs of 23 batches: past the 50 warm-up steps
        for x, y in train:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    params = config.scheduler.params
    assert isinstance(optimizer, torch.optim.AdamW)
    assert scheduler.last_epoch == len(losses) > params["warmup_steps"]
    assert params["min_lr"] < scheduler.get_last_lr()[0] < config.optimizer.lr  # decaying
    assert sum(losses[-10:]) < sum(losses[:10])


def test_custom_config_builds_the_registered_polynomial_schedule():
    register_scheduler("polynomial", PolynomialDecaySchedule)
    config = load_config(DATA / "scheduler_custom.yaml")
    optimizer = build_optimizer(torch.nn.Linear(2, 1).parameters(), config)
    scheduler = build_scheduler(optimizer, config)
    for _ in range(400):
        optimizer.step()
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(config.scheduler.params["min_lr"])


def test_exponent_without_a_dot_is_read_as_a_string_by_yaml_and_converted(tmp_path):
    text = yaml.safe_dump(GOOD).replace("0.001", "1e-3")
    assert yaml.safe_load(text)["training"]["optimizer"]["lr"] == "1e-3"
    with pytest.warns(UserWarning, match=r"training\.optimizer\.lr: .*write 1\.0e-3$"):
        assert load_config(write(tmp_path, text)).optimizer.lr == 1e-3


def test_min_lr_written_without_a_dot_is_converted(tmp_path):
    text = yaml.safe_dump(GOOD).replace("1.0e-05", "1e-5")
    assert "1e-5" in text
    with pytest.warns(UserWarning, match=r"training\.scheduler\.min_lr: .*write 1\.0e-5$"):
        assert load_config(write(tmp_path, text)).scheduler.params["min_lr"] == 1e-5


@pytest.mark.parametrize(
    ("written", "spelling"), [("1e-4", "1.0e-4"), ("1.0e5", "1.0e+5"), ("3E-4", "3.0e-4")]
)
def test_a_float_yaml_reads_as_a_string_is_converted_with_a_message_naming_the_field_and_the_fix(
    tmp_path, written, spelling
):
    """A dot is not enough: PyYAML reads 1.0e5 as a string too; the message says 1.0e+5."""
    text = yaml.safe_dump(GOOD).replace("0.001", written)
    assert yaml.safe_load(text)["training"]["optimizer"]["lr"] == written  # a string, not a float
    with pytest.warns(UserWarning) as caught:
        config = load_config(write(tmp_path, text))
    assert config.optimizer.lr == float(written)
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(
        f"training.optimizer.lr: YAML read {written} as the string {written!r}"
    )
    assert "signed exponent" in message and message.endswith(f"write {spelling}")
    assert yaml.safe_load(f"lr: {spelling}")["lr"] == float(written)  # the fix is what YAML reads


def test_a_float_written_as_yaml_reads_it_loads_without_a_message(tmp_path):
    text = yaml.safe_dump(GOOD).replace("0.001", "1.0e+5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(write(tmp_path, text)).optimizer.lr == 1e5


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("training.scheduler.type", "cosine", r"must be one of \[.*'cosine_annealing'"),
        ("training.optimizer.type", "lion", r"must be one of \['sgd', 'adam', 'adamw'\]"),
        ("training.scheduler.warmup_steps", -1, r"integer >= 0"),
        ("training.scheduler.warmup_steps", 10.5, r"integer >= 0"),
        ("training.scheduler.total_steps", 1.0e5, r"plain integer such as 100000"),
        ("training.scheduler.total_steps", "1e5", r"plain integer such as 100000"),
        (
            "training.scheduler.warmup_steps",
            500,
            r"warm-up \(500 steps\) must be shorter than the run",
        ),
        ("training.scheduler.min_lr", 0.01, r"must not exceed the optimizer lr"),
        ("training.scheduler.min_lr", "a lot", r"must be a number"),
        ("training.optimizer.lr", -1.0, r"must be a number in \[0.0"),
        ("training.optimizer.lr", True, r"must be a number"),
        ("training.scheduler.total_steps", ..., r"missing required field"),
        ("training.optimizer.lr", ..., r"missing required field"),
        (
            "training.scheduler.max_lr",
            1.0,
            r"unknown field; allowed fields: \['min_lr', 'total_steps', 'type', 'warmup_steps'\]",
        ),
        (
            "training.optimizer.momentum",
            0.9,
            r"unknown field; allowed fields: \['betas', 'eps', 'lr', 'weight_decay'\]",
        ),
        ("training.optimizer.betas", [0.9], r"list of two numbers"),
    ],
)
def test_invalid_field_raises_config_error_naming_the_dotted_field(path, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        validate_config(with_field(path, value))
    assert info.value.field == path
    assert str(info.value).startswith(f"{path}: ")


def test_scheduler_argument_checks_surface_with_the_field_name():
    data = with_field(
        "training.scheduler",
        {"type": "wsd", "total_steps": 100, "warmup_steps": 10, "decay_steps": 20, "decay": "exp"},
    )
    with pytest.raises(
        ConfigError, match=r"decay must be one of \('linear', 'cosine', '1-sqrt'\)"
    ) as info:
        validate_config(data)
    assert info.value.field == "training.scheduler.decay"


def test_missing_training_section_is_named():
    with pytest.raises(ConfigError, match=r"^training: missing required field"):
        validate_config({"optimizer": {}})


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_invalid_yaml_is_a_config_error_naming_the_file(tmp_path):
    path = write(tmp_path, "training: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_yaml_tags_that_would_run_code_are_refused(tmp_path):
    path = write(tmp_path, "training: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_every_yaml_file_under_docs_data_for_schedulers_validates():
    register_scheduler("polynomial", PolynomialDecaySchedule)
    files = sorted(DATA.glob("scheduler*.yaml"))
    assert files
    for file in files:
        load_config(file)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "training.optimizer.betas",
            [0.9, 1.0],
            r"training.optimizer.betas\[1\]: must be a number in \[0, 1\), got 1.0",
        ),
        (
            "training.optimizer.betas",
            [-0.1, 0.99],
            r"training.optimizer.betas\[0\]: must be a number in \[0, 1\)",
        ),
        (
            "training.optimizer.betas",
            ["0.9", "nan"],
            r"training.optimizer.betas\[1\]: must be a number in \[0, 1\)",
        ),
    ],
)
def test_betas_outside_zero_to_one_are_a_config_error(path, value, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(with_field(path, value))


def test_nesterov_without_momentum_is_a_config_error_naming_nesterov():
    sgd = {"type": "sgd", "lr": 0.1, "nesterov": True}
    with pytest.raises(
        ConfigError, match=r"^training.optimizer.nesterov: needs a momentum above 0"
    ):
        validate_config(with_field("training.optimizer", sgd))


def test_a_hand_made_config_that_torch_refuses_is_a_config_error_not_torchs_value_error():
    from trainopt.config.training import OptimizerConfig

    with pytest.raises(
        ConfigError, match=r"^training.optimizer: torch.optim.Adam refuses it: Invalid beta"
    ):
        build_optimizer(
            torch.nn.Linear(2, 1).parameters(), OptimizerConfig("adam", 1e-3, {"betas": (0.9, 1.0)})
        )


_NUMBERS = st.sampled_from(
    [0, 0.0, 0.5, 0.9, 0.999, 1, 1.0, 1.5, -0.1, 1e-8, "1e-3", "nan", True, None]
)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["sgd", "adam", "adamw"]),
    lr=_NUMBERS,
    weight_decay=_NUMBERS,
    momentum=_NUMBERS,
    nesterov=st.sampled_from([True, False, None]),
    eps=_NUMBERS,
    betas=st.tuples(_NUMBERS, _NUMBERS),
)
def test_a_validated_config_always_builds_its_optimizer(
    kind, lr, weight_decay, momentum, nesterov, eps, betas
):
    """Whatever a config holds, either validation names a field or torch builds the optimizer."""
    fields = {
        "lr": lr,
        "weight_decay": weight_decay,
        "momentum": momentum,
        "nesterov": nesterov,
        "eps": eps,
        "betas": list(betas),
    }
    from trainopt.config.training import OPTIMIZER_SETTINGS

    section = {
        "type": kind,
        **{k: v for k, v in fields.items() if k in OPTIMIZER_SETTINGS[kind] and v is not None},
    }
    try:
        config = validate_config(with_field("training.optimizer", section))
    except ConfigError:
        return
    build_optimizer(torch.nn.Linear(2, 1).parameters(), config)
