"""csrc/config.h is the one source of the rendering constants; rigel_core/config.py (and the SH band constants of
the reference) must mirror it exactly. Parses the header's ``#define RIGEL_*`` lines (CPU only, runs in CI)."""
import ast
import operator
import re
from pathlib import Path

import pytest
import torch

from rigel_core import config
from rigel_core.reference import sh as ref_sh

HEADER = Path(__file__).resolve().parents[1] / "csrc" / "config.h"
# Launch parameters: they change speed, never results, so Python has no mirror of them.
KERNEL_ONLY = {"KERNEL_BLOCK_1D"}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _literal(text: str):
    """Value of a C numeric literal or a +-*/ expression of them (suffixes f, L, LL, U stripped)."""
    text = re.sub(r"(?<=[0-9.])(?:[fF]|[uU]?[lL]{1,2}|[uU])\b", "", text.strip())

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"config.h: cannot evaluate {text!r}")

    return ev(ast.parse(text, mode="eval"))


def header_constants() -> dict:
    out = {}
    for line in HEADER.read_text().splitlines():
        m = re.match(r"\s*#define\s+RIGEL_(\w+)\s+(.+?)\s*(?://.*)?$", line)
        if m:
            out[m.group(1)] = _literal(m.group(2))
    return out


def python_mirror(name: str):
    """The Python value a header constant must equal, or raise KeyError when there is none."""
    m = re.fullmatch(r"SH_C([23])_(\d)", name)
    if m:
        return (ref_sh.SH_C2 if m.group(1) == "2" else ref_sh.SH_C3)[int(m.group(2))]
    if hasattr(config, name):
        return getattr(config, name)
    raise KeyError(name)


def test_literal_parser():
    assert _literal("(1.0f / 255.0f)") == 1.0 / 255.0
    assert _literal("100000000LL") == 100_000_000
    assert _literal("-0.5900435899266435") == -0.5900435899266435
    assert _literal("1e10f") == 1e10
    with pytest.raises(ValueError):
        _literal("sqrt(2)")


def test_header_parses_every_define():
    defines = [l for l in HEADER.read_text().splitlines() if re.match(r"\s*#define\s+RIGEL_", l)]
    consts = header_constants()
    assert len(consts) == len(defines) and len(consts) > 10


def test_header_equals_python_mirror():
    consts = header_constants()
    missing, wrong = [], []
    for name, value in consts.items():
        if name in KERNEL_ONLY:
            continue
        try:
            py = python_mirror(name)
        except KeyError:
            missing.append(name)
            continue
        if type(py) is int and type(value) is int:
            ok = py == value
        else:
            ok = float(py) == float(value)  # exact: both are the same decimal literal
        if not ok:
            wrong.append(f"{name}: config.h {value!r} != Python {py!r}")
    assert not missing, f"constants of csrc/config.h without a Python mirror: {missing}"
    assert not wrong, "; ".join(wrong)


def test_python_constants_all_in_header():
    consts = header_constants()
    py_names = [n for n in vars(config) if n.isupper() and not n.startswith("_")]
    assert py_names, "rigel_core.config defines no constants"
    absent = [n for n in py_names if n not in consts]
    assert not absent, f"rigel_core.config constants missing from csrc/config.h: {absent}"
    assert len(ref_sh.SH_C2) == 5 and len(ref_sh.SH_C3) == 7
    for i in range(5):
        assert f"SH_C2_{i}" in consts
    for i in range(7):
        assert f"SH_C3_{i}" in consts


def test_config_fields_are_type_checked():
    """--set and checkpoint configs reach TrainConfig as JSON values: before, 'maybe' turned exposure on, True
    was a max_gaussians, '0.1' failed later with a message naming no field, 1e30 iterations were accepted."""
    from rigel_core.train import TrainConfig
    from rigel_core.train.config import MAX_ITERATION

    bad = {"exposure": "maybe", "max_gaussians": True, "exposure_lr_init": "0.1", "iterations": 1e30,
           "init_background_radius": float("inf"), "appearance": 3, "init_box": [0, 0, 0, 1, 1, "x"],
           "seed": 1.5, "densify_interval": None}
    for field, value in bad.items():
        with pytest.raises(ValueError, match=f"TrainConfig.{field} "):
            TrainConfig(**{field: value}).validate()
    with pytest.raises(ValueError, match="TrainConfig.iterations must be ≤"):
        TrainConfig(iterations=MAX_ITERATION + 1).validate()
    # --set FIELD=null: the line says the field has no 'none' value (it said "must be float, got None", and a float
    # field's other refusals say "a finite number")
    for field, what in (("mcmc_growth_max_dead", "a finite number"), ("densify_until", "int"),
                        ("exposure", "bool")):
        with pytest.raises(ValueError) as e:
            TrainConfig(**{field: None}).validate()
        assert str(e.value).startswith(f"TrainConfig.{field} must be {what}, got None (null: "), str(e.value)
    # values that used to train silently wrong (a negative learning rate ascends the loss; max_steps −1 jumps to
    # the final position lr at step 1) or fail later naming no field ("math domain error", "Invalid epsilon")
    wrong = [("position_lr_init", -1e-4), ("position_lr_final", -1e-6), ("scaling_lr", -1.0), ("rotation_lr", -1e-3),
             ("opacity_lr", -0.05), ("adam_eps", 0.0), ("adam_eps", -1.0), ("init_opacity", 1.0),
             ("init_opacity", 0.0), ("position_lr_max_steps", 0), ("position_lr_max_steps", -1)]
    for field, value in wrong:
        with pytest.raises(ValueError, match=f"TrainConfig.{field} "):
            TrainConfig(**{field: value}).validate()
    TrainConfig(position_lr_init=0.0, position_lr_final=0.0, scaling_lr=0.0, rotation_lr=0.0, opacity_lr=0.0,
                init_opacity=0.999, position_lr_max_steps=1).validate()   # a frozen group, the edges, are fine
    for seed in (2**64, -2**63 - 1, 10**20):   # torch.Generator.manual_seed's range: before, "Overflow when
        with pytest.raises(ValueError, match="TrainConfig.seed "):   # unpacking long long" after the data loaded
            TrainConfig(seed=seed).validate()
    for seed in (2**64 - 1, -2**63, 0):
        TrainConfig(seed=seed).validate()
        torch.Generator().manual_seed(seed)   # the range is torch's own
    c = TrainConfig(iterations=1e4, max_gaussians=None, init_box=(0, 0, 0, 1, 1, 1))  # JSON's 1e4 is an integer
    c.validate()
    assert c.iterations == 10000 and type(c.iterations) is int


#: one bad value per field that a check shared with other fields refused, and what the field must be
_ALONE = [("mlp_latent_dim", 0, "in 1..{}"), ("mlp_hidden_dim", 10_000, "in 1..{}"), ("latent_lr", -1.0, "≥ 0"),
          ("mlp_lr", -1e-3, "≥ 0"), ("exposure_lr_init", -1e-3, "≥ 0"), ("exposure_lr_final", -1e-6, "≥ 0"),
          ("exposure_lr_delay_steps", -1, "≥ 0"), ("exposure_lr_delay_mult", 2.0, "in [0, 1]"),
          ("exposure_lr_delay_mult", -0.5, "in [0, 1]"), ("pose_opt_lr", -1, "≥ 0"),
          ("pose_opt_lr_final", -1e-6, "≥ 0"), ("pose_opt_reg", -0.1, "≥ 0"), ("pose_opt_from", -1, "≥ 0"),
          ("eval_pose_steps", -1, "≥ 0"), ("eval_pose_lr", -1e-3, "≥ 0"), ("appearance_grid_bins", 1, "≥ 2"),
          ("appearance_grid_size", 0, "≥ 2"), ("appearance_grid_lr", -1.0, "≥ 0"), ("appearance_grid_tv", -1.0, "≥ 0"),
          ("mcmc_min_opacity", 0.0, "in (0, 1)"), ("mcmc_min_opacity", 1.0, "in (0, 1)"),
          ("mcmc_noise_t", 1.5, "in [0, 1]")]


@pytest.mark.parametrize("field,value,what", _ALONE)
def test_a_refused_value_names_its_field_alone(field, value, what):
    """Each field is refused on its own, named with its value: before, ``pose_opt_lr=-1`` said "TrainConfig.pose_opt_*,
    eval_pose_steps, eval_pose_lr must be ≥ 0, got -1, 1e-06, 0.0, 0, 100, 0.001" (six values, which one?), and the
    appearance grid, exposure schedule, MLP sizes and rates and MCMC opacity/noise fields were grouped the same way.
    The neighbours keep their valid defaults (each alone is accepted at its edge)."""
    from rigel_core.train import TrainConfig
    from rigel_core.train.config import APPEARANCE_MAX_HIDDEN, APPEARANCE_MAX_LATENT

    what = what.format(APPEARANCE_MAX_LATENT if field == "mlp_latent_dim" else APPEARANCE_MAX_HIDDEN)
    with pytest.raises(ValueError) as e:
        TrainConfig(**{field: value}).validate()
    assert str(e.value) == f"TrainConfig.{field} must be {what}, got {value!r}"
    edge = {"≥ 0": 0, "≥ 2": 2, "in [0, 1]": 1.0, "in (0, 1)": 0.5}.get(what, 1)
    TrainConfig(**{field: type(value)(edge)}).validate()
