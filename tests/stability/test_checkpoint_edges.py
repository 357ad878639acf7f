"""Checkpoint edges (issue 21, requirements 7 and 3): the newest checkpoint is the one holding the
highest step, whatever the file names say; optimizer state of another shape or parameter order is
refused naming the parameter; every load failure is a CheckpointError that changes nothing; a save
accepts exactly what torch.load(weights_only=True) reads."""

from __future__ import annotations

import collections
import copy
import io
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from trainopt.stability.checkpointing.checkpoint import CheckpointError, CheckpointManager
from trainopt.stability.checkpointing.fit import _PER_PARAMETER
from trainopt.stability.checkpointing.rng import get_rng_state


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


def _trained(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 2) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 2)).pow(2).mean().backward()
        opt.step()


# -------------------------------------------------------------------------- newest by the step held


def test_a_copy_with_a_larger_number_in_its_name_but_an_older_step_is_not_the_newest(
    tmp_path,
) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (10, 20):
        manager.save_checkpoint(model, None, step, loss=1.0 / step)
    shutil.copy(manager.path_for(10), manager.path_for(99))
    fresh = CheckpointManager(tmp_path, keep_last=None)
    with pytest.warns(UserWarning, match=r"checkpoint_step_99\.pt holds step 10, not the 99"):
        assert fresh.latest_path() == manager.path_for(20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read once per file: no second warning
        assert fresh.load_latest(model, None) == (20, 0.05)
        assert fresh.checkpoints()[-1] == manager.path_for(20)


def test_a_file_renamed_to_a_smaller_number_still_counts_by_the_step_it_holds(tmp_path) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (10, 30):
        manager.save_checkpoint(model, None, step, loss=1.0)
    manager.path_for(30).rename(manager.path_for(5))
    with pytest.warns(UserWarning, match="holds step 30"):
        assert CheckpointManager(tmp_path).load_latest(model, None) == (30, 1.0)


def test_keep_last_prunes_by_the_step_held(tmp_path) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in (10, 20):
        manager.save_checkpoint(model, None, step, loss=1.0)
    shutil.copy(manager.path_for(10), manager.path_for(99))
    with pytest.warns(UserWarning, match="holds step 10"):
        manager.save_checkpoint(model, None, 30, loss=1.0)
    assert sorted(p.name for p in tmp_path.glob("checkpoint_step_*")) == [
        "checkpoint_step_20.pt",
        "checkpoint_step_30.pt",
    ]


def test_an_overwritten_file_is_read_again(tmp_path) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (10, 20):
        manager.save_checkpoint(model, None, step, loss=1.0)
    assert manager.checkpoints()[-1].name == "checkpoint_step_20.pt"
    other = CheckpointManager(tmp_path / "other")
    shutil.copy(
        other.save_checkpoint(model, None, 5, loss=1.0), manager.path_for(20)
    )  # same name, step 5
    with pytest.warns(UserWarning, match="holds step 5"):
        assert [p.name for p in manager.checkpoints()] == [
            "checkpoint_step_20.pt",
            "checkpoint_step_10.pt",
        ]


# ---------------------------------------------------------------- optimizer state that does not fit


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()})


def _assert_same(a: Any, b: Any) -> None:
    if torch.is_tensor(a):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("stepped", [False, True], ids=["fresh optimizer", "optimizer with state"])
def test_optimizer_state_of_another_parameter_order_is_refused_naming_the_parameter(
    tmp_path, stepped
) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _trained(model, opt)
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(model, opt, 2, 1.0)

    target = _model(seed=1)
    weight0, bias0, weight2, bias2 = target.parameters()
    reordered = torch.optim.AdamW(
        [weight2, bias2, weight0, bias0], lr=1e-2
    )  # the same model, another order
    if stepped:
        _trained(target, reordered)
    before = _snapshot(target, reordered)
    with pytest.raises(CheckpointError) as caught:
        manager.load_latest(target, reordered)
    assert (
        "checkpoint_step_2.pt does not fit the optimizer: param_groups[0] parameter 0 "
        "('2.weight', index 0): state 'exp_avg' has shape (4, 2) in the file, (2, 4) in the "
        "optimizer"
    ) in str(caught.value)
    _assert_same(_snapshot(target, reordered), before)


def test_optimizer_state_of_another_shape_is_refused_before_the_next_step(tmp_path) -> None:
    """The same parameter count and ranks: before, this loaded and failed at the next step."""
    small = torch.nn.Linear(3, 3, bias=False)
    opt = torch.optim.SGD(small.parameters(), lr=0.1, momentum=0.9)
    _trained(torch.nn.Sequential(torch.nn.Linear(2, 3), small), opt)
    path = CheckpointManager(tmp_path).save_checkpoint(small, opt, 1, 1.0)
    wide = torch.nn.Linear(5, 3, bias=False)
    wide_opt = torch.optim.SGD(wide.parameters(), lr=0.1, momentum=0.9)
    _rewrite(path, _set(("model",), wide.state_dict()))  # only the optimizer state is another shape
    with pytest.raises(
        CheckpointError,
        match=r"parameter 0 \('weight', index 0\): state 'momentum_buffer' "
        r"has shape \(3, 3\) in the file, \(3, 5\)",
    ):
        CheckpointManager(tmp_path).load_checkpoint(wide, wide_opt, path)


def _rewrite(path: Path, edit: Any) -> None:
    """Edit a checkpoint's payload in place (a new file: best_checkpoint.pt may be a link to it)."""
    payload = torch.load(path, weights_only=True)
    edit(payload)
    path.unlink()
    torch.save(payload, path)


def _optimizers() -> dict[str, Any]:
    found = {}
    for name, cls in vars(torch.optim).items():
        if (
            isinstance(cls, type)
            and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer
            and name != "SparseAdam"
        ):  # sparse gradients only
            found[name] = lambda params, cls=cls: cls(params, lr=1e-2)
    found["Adam(amsgrad)"] = lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True)
    found["SGD(momentum)"] = lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9)
    found["RMSprop(centered, momentum)"] = lambda params: torch.optim.RMSprop(
        params, lr=1e-2, centered=True, momentum=0.9
    )
    return found


@pytest.mark.parametrize("name, make", _optimizers().items(), ids=_optimizers().keys())
def test_the_state_of_every_torch_optimizer_loads_and_per_parameter_state_has_its_parameters_shape(
    tmp_path, name, make
) -> None:
    """No false refusals: Adafactor's row and column variances, LBFGS's flat vectors load."""

    def build(seed: int):
        torch.manual_seed(seed)
        shapes = (
            [(3, 5), (2, 3)] if name == "Muon" else [(3, 5), (4,), (2, 3, 4)]
        )  # Muon: matrices only
        module = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(s)) for s in shapes])
        return module, make(module.parameters())

    module, opt = build(0)
    for _ in range(2):

        def closure():
            opt.zero_grad()
            loss = sum((p**2).sum() for p in module.parameters())
            loss.backward()
            return loss

        opt.step(closure)
    for p in module.parameters():
        for key, value in opt.state[p].items():
            if key in _PER_PARAMETER and torch.is_tensor(value):
                assert value.shape == p.shape, key
    path = CheckpointManager(tmp_path).save_checkpoint(module, opt, 2, 1.0)
    fresh, fresh_opt = build(1)
    CheckpointManager(tmp_path).load_checkpoint(fresh, fresh_opt, path)
    _assert_same(fresh_opt.state_dict(), opt.state_dict())


# ---------------------------------------------------------- every load failure is a CheckpointError


class _Counter:
    def __init__(self) -> None:
        self.n = 3

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.n = int(state["n"])  # TypeError for None, KeyError when missing


def _set(path: tuple, value: Any):
    def edit(payload: dict[str, Any]) -> None:
        target = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


BROKEN = {
    "a model entry that is not a tensor": (
        _set(("model", "0.weight"), "weights"),
        "the model: 0.weight: a str in the file, a tensor in the model",
    ),
    "a model state that is a list": (_set(("model",), [1, 2]), "model is a list, must be dict"),
    "an optimizer state that is not a state dict": (
        _set(("optimizer",), {"state": []}),
        "the optimizer: not an optimizer state dict",
    ),
    "optimizer params that are not a list": (
        _set(("optimizer", "param_groups", 0, "params"), 3),
        "the optimizer: param_groups[0] is not a dict with a list 'params'",
    ),
    "optimizer state that is not a tensor": (
        _set(("optimizer", "state", 1, "exp_avg"), "x"),
        "parameter 1 ('0.bias', index 1): state 'exp_avg' is a str",
    ),
    "a scheduler value of another kind": (
        _set(("scheduler", "last_epoch"), "3"),
        "the scheduler: last_epoch is a str in the file, a number here",
    ),
    "a scheduler state that is not a dict": (
        _set(("scheduler",), [0.1]),
        "the scheduler: a list, not a state dict",
    ),
    "an extra object's load_state_dict raising TypeError": (
        _set(("extra", "counter", "n"), None),
        "the extra['counter']: TypeError",
    ),
    "an extra object's load_state_dict raising KeyError": (
        _set(("extra", "counter"), {}),
        "the extra['counter']: KeyError",
    ),
    "random number generator states that do not load": (
        _set(("rng", "torch"), torch.zeros(3)),
        "the random number generators: TypeError",
    ),
    "a missing entry": (lambda payload: payload.pop("rng"), "is incomplete: missing ['rng']"),
    "a step that is not an int": (
        _set(("step",), "2"),
        "step is a str, must be a non-negative int",
    ),
    "a loss that is not a number": (
        _set(("loss",), None),
        "loss is a NoneType, must be int or float",
    ),
    "extra states that are not a dict": (_set(("extra",), []), "extra is a list, must be dict"),
}


@pytest.mark.parametrize("edit, message", BROKEN.values(), ids=BROKEN.keys())
def test_every_load_failure_is_a_checkpoint_error_naming_the_file_and_piece_and_changes_nothing(
    tmp_path, edit, message
) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    _trained(model, opt)
    sched.step()
    path = CheckpointManager(tmp_path).save_checkpoint(
        model, opt, 2, 1.0, scheduler=sched, extra={"counter": _Counter()}
    )
    _rewrite(path, edit)

    target = _model(seed=1)
    target_opt = torch.optim.AdamW(target.parameters(), lr=1e-2)
    target_sched = torch.optim.lr_scheduler.StepLR(target_opt, step_size=2)
    counter = _Counter()
    counter.n = 7
    _trained(target, target_opt, 1)
    before = copy.deepcopy(
        {
            "model": target.state_dict(),
            "optimizer": target_opt.state_dict(),
            "scheduler": target_sched.state_dict(),
            "counter": counter.state_dict(),
            "rng": get_rng_state(),
        }
    )
    with pytest.raises(CheckpointError) as caught:
        CheckpointManager(tmp_path).load_checkpoint(
            target, target_opt, path, scheduler=target_sched, extra={"counter": counter}
        )
    assert message in str(caught.value) and "checkpoint_step_2.pt" in str(caught.value)
    _assert_same(
        {
            "model": target.state_dict(),
            "optimizer": target_opt.state_dict(),
            "scheduler": target_sched.state_dict(),
            "counter": counter.state_dict(),
            "rng": get_rng_state(),
        },
        before,
    )
    target_opt.step()  # still the optimizer it was


# ----------------------------------------------------------- a save accepts what weights_only reads


Pair = collections.namedtuple("Pair", "a b")


class _Point:
    def __init__(self, x: int = 0) -> None:
        self.x = x


VALUES = {
    "Counter": collections.Counter([5, 15, 15]),
    "OrderedDict": collections.OrderedDict(a=1),
    "set": {1, 2},
    "complex": 1 + 2j,
    "bytes and bytearray": [b"ab", bytearray(b"cd")],
    "torch.Size, dtype, device": (torch.Size([2]), torch.float16, torch.device("cpu")),
    "a Parameter": torch.nn.Parameter(torch.ones(2)),
    "defaultdict": collections.defaultdict(int, a=1),
    "a namedtuple": Pair(1, 2),
    "a function": print,
    "frozenset": frozenset({1}),
    "an object": _Point(),
}


def _torch_accepts(value: Any) -> bool:
    buffer = io.BytesIO()
    torch.save({"value": value}, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:
        return False
    return True


class _Holder:
    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


@pytest.mark.parametrize("value", VALUES.values(), ids=VALUES.keys())
def test_a_save_accepts_exactly_what_the_weights_only_loader_reads(tmp_path, value) -> None:
    model = _model()
    manager = CheckpointManager(tmp_path)
    if _torch_accepts(value):
        manager.save_checkpoint(model, None, 1, 1.0, extra={"holder": _Holder(value)})
        holder = _Holder(None)
        manager.load_latest(model, None, extra={"holder": holder})
        assert type(holder.value) is type(value) and repr(holder.value) == repr(value)
    else:
        with pytest.raises(
            CheckpointError,
            match=r"checkpoint\['extra'\]\['holder'\]\['value'\].* is a "
            r"[^:]+: checkpoints hold only what torch.load\(weights_only=True\)",
        ):
            manager.save_checkpoint(model, None, 1, 1.0, extra={"holder": _Holder(value)})
        assert not list(tmp_path.iterdir())


def test_the_values_that_break_the_old_check_are_accepted_and_the_others_refused() -> None:
    accepted = {name for name, value in VALUES.items() if _torch_accepts(value)}
    assert {
        "Counter",
        "OrderedDict",
        "set",
        "complex",
        "bytes and bytearray",
        "a Parameter",
    } <= accepted
    assert not accepted & {"defaultdict", "a namedtuple", "a function", "an object"}


def test_a_class_allowed_with_safe_globals_is_accepted(tmp_path) -> None:
    model = _model()
    with torch.serialization.safe_globals([_Point]):
        CheckpointManager(tmp_path).save_checkpoint(
            model, None, 1, 1.0, extra={"holder": _Holder(_Point(4))}
        )
        holder = _Holder(None)
        CheckpointManager(tmp_path).load_latest(model, None, extra={"holder": holder})
    assert holder.value.x == 4


def test_multistep_lr_is_saved_and_its_milestones_come_back_a_counter(tmp_path) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[2, 4], gamma=0.5)
    CheckpointManager(tmp_path).save_checkpoint(model, opt, 0, 1.0, scheduler=sched)
    again = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[9], gamma=0.5)
    CheckpointManager(tmp_path).load_latest(model, opt, scheduler=again)
    assert again.milestones == collections.Counter([2, 4])
