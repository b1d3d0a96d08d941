"""What ``windtunnel reproduce`` reproduces: its studies, their presets, scales and analysis groups.

A *study* (:data:`STUDIES`) is a set of training presets and the analysis groups that read
them, at the scales it offers:

- ``claims`` (the default): the paper's claims (:data:`PRESETS`, :data:`GROUPS`) at the
  scales :data:`SCALES`: ``tiny`` (minutes-scale models, a first look at the pipeline; its
  numbers mean nothing), ``cpu`` (the ``configs/cpu`` presets: what was cut relative to the
  paper is listed in the report) and ``paper`` (the ``configs/paper`` presets, the paper's
  protocol and seeds; expects a GPU);
- ``architectures``: transformer, Mamba, LSTM and MLP on the tunnel of each inference
  primitive (:data:`ARCHITECTURE_PRESETS`, :data:`ARCHITECTURE_SCALES`);
- ``future_work``: the same four on the tunnels of the paper's future work, Laplace
  accumulation (``dirichlet``, ``markov``) and Gaussian filtering (``kalman``)
  (:data:`FUTURE_WORK_PRESETS`, :data:`FUTURE_WORK_SCALES`);
- ``model_selection``: the findings of the authors' model-selection paper (arXiv 2607.19379)
  on the ``model_selection`` tunnel: one class in three symbol modes, two classes compared, and
  every architecture on the comparison (:data:`MODEL_SELECTION_PRESETS`,
  :data:`MODEL_SELECTION_SCALES`).

A :class:`Scale` says where a study's presets live (``configs/<scale>/``), the seeds of each,
the overrides that shrink them, what each run is expected to take and what the scale cuts.
This module is data: :mod:`windtunnel.reproduce` plans the runs from it and runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

__all__ = [
    "ARCHITECTURES", "ARCHITECTURE_PRESETS", "ARCHITECTURE_SCALES", "FUTURE_WORK_PRESETS", "FUTURE_WORK_SCALES",
    "FUTURE_WORK_TUNNELS", "GROUPS", "HISTORY_ANALYSES", "MODEL_SELECTION_PRESETS", "MODEL_SELECTION_SCALES", "PRESETS",
    "PRESET_NAMES", "PRIMITIVE_TUNNELS", "SCALES", "STUDIES", "AnalysisGroup", "Preset", "Scale", "Study", "configs_folder",
]

@dataclass(frozen=True)
class Preset:
    """A training run of the plan: a config file under ``configs/<scale>/`` and overrides
    that make a task variant of it (a twin trained on the authors' sampling)."""

    name: str
    config: str
    overrides: tuple[str, ...] = ()


#: The authors' HMM generator: every entry of T and E floored at 0.05, on the 0.01 grid. The
#: paper's HMM numbers belong to it (its context-free prior scores 0.414 bits, the paper's
#: MLP "0.40"; ours without the floor 0.52-0.55).
AUTHORS_HMM = ("tunnel.floor=0.05", "tunnel.grid=0.01")
#: The authors' bijection sampling: inputs drawn with replacement (their default), 19 pairs.
AUTHORS_BIJECTION = ("tunnel.with_replacement=true",)

#: The curriculum of configs/cpu/bijection_replacement_transformer.toml, given to its MLP twin
#: at the scales that use the CPU presets: within a task every model sees the same training
#: stream (docs/protocol.md §5; tests/test_reproduce.py holds the two equal).
CPU_REPLACEMENT_CURRICULUM = (
    "tunnel.repeat_window=1",
    "train.curriculum.param=repeat_rate",
    "train.curriculum.start=0.6",
    "train.curriculum.steps=1500",
    "train.curriculum.shape=linear",
)

#: The runs a reproduction trains, in plan order.
PRESETS = (
    Preset("bijection_transformer", "bijection_transformer"),
    Preset("bijection_mlp", "bijection_mlp"),
    Preset("bijection_replacement_transformer", "bijection_replacement_transformer"),
    Preset("bijection_replacement_mlp", "bijection_mlp", AUTHORS_BIJECTION),
    Preset("hmm_transformer", "hmm_transformer"),
    Preset("hmm_mlp", "hmm_mlp"),
    Preset("hmm_late_attention_off", "hmm_late_attention_off"),
    Preset("hmm_transformer_floor", "hmm_transformer", AUTHORS_HMM),
    Preset("hmm_mlp_floor", "hmm_mlp", AUTHORS_HMM),
    Preset("hmm_late_attention_off_floor", "hmm_late_attention_off", AUTHORS_HMM),
)
PRESET_NAMES = tuple(preset.name for preset in PRESETS)


_TINY_TRANSFORMER = ("model.d_model=32", "model.d_mlp=64", "model.n_heads=2")
# The CPU HMM presets have 6 layers; the tiny scale keeps 4 (its late-attention variant
# without attention in layers 2 and 3, the top two), as for the bijection.
_TINY_HMM_TRANSFORMER = (*_TINY_TRANSFORMER, "model.n_layers=4", "model.init_std=0.02")
_TINY_HMM_LATE_ATTENTION_OFF = (*_TINY_HMM_TRANSFORMER, "model.no_attention_layers=[2, 3]")
# Too few parameters for 18 blocks: 4 blocks, the width chosen to match the tiny transformer.
_TINY_MLP = (
    "model.d_model=32",
    "model.n_blocks=4",
    "model.matched_to.d_model=32",
    "model.matched_to.d_mlp=64",
    "model.matched_to.n_heads=2",
)
_TINY_HMM_MLP = (*_TINY_MLP, "model.matched_to.n_layers=4", "model.matched_to.init_std=0.02")
_TINY_TRAIN = (
    "train.steps=150",
    "train.batch_size=32",
    "train.warmup_steps=20",
    "train.eval_every=0",
    "train.checkpoint_every=50",
    "eval.n=256",
    "eval.bootstrap=200",
)


@dataclass(frozen=True)
class Scale:
    """One size of the reproduction.

    Attributes:
        configs: the preset folder (``cpu`` or ``paper``).
        seeds: seeds per preset (presets not named: 1; 0 leaves the preset out).
        overrides: ``--set`` overrides per preset (``"*"``: every preset).
        parallel: runs trained side by side by default.
        expected_s: measured wall seconds per run of each preset at ``parallel`` (for the ETA).
        hardware: what the scale expects, said before anything starts.
        cuts: what differs from the paper's protocol, listed in the report.
        meaning: what the scale's verdicts mean, said beside the report's claim table.
        warmup_steps: steps of each run's training step timed on the device found before
            training starts, to state the projected time per run from a measurement rather
            than from ``expected_s`` (0: no warm-up; ``expected_s`` is the guess).
        keep_final_weights_only: once analyzed, each run keeps its final weights (float32
            shards, ``runs.keep_final_weights``) instead of its training state and snapshots,
            so that its folder can be a results folder kept in a repository.
    """

    name: str
    configs: str
    seeds: Mapping[str, int]
    overrides: Mapping[str, tuple[str, ...]]
    parallel: int
    expected_s: Mapping[str, float]
    hardware: str
    cuts: tuple[str, ...] = field(default=())
    meaning: str = ""
    warmup_steps: int = 0
    keep_final_weights_only: bool = False

    def overrides_for(self, preset: str) -> tuple[str, ...]:
        return (*self.overrides.get("*", ()), *self.overrides.get(preset, ()))


SCALES: dict[str, Scale] = {
    "tiny": Scale(
        name="tiny",
        configs="cpu",
        seeds={
            "bijection_transformer": 2,
            "hmm_transformer_floor": 0,
            "hmm_late_attention_off_floor": 0,
        },
        overrides={
            "*": _TINY_TRAIN,
            "bijection_transformer": _TINY_TRANSFORMER,
            "bijection_replacement_transformer": _TINY_TRANSFORMER,
            "hmm_transformer": _TINY_HMM_TRANSFORMER,
            "hmm_late_attention_off": _TINY_HMM_LATE_ATTENTION_OFF,
            "bijection_mlp": _TINY_MLP,
            "bijection_replacement_mlp": (*_TINY_MLP, *CPU_REPLACEMENT_CURRICULUM),
            "hmm_mlp": _TINY_HMM_MLP,
            "hmm_mlp_floor": _TINY_HMM_MLP,
        },
        parallel=2,
        expected_s={"bijection": 12.0, "hmm": 20.0},
        hardware="any machine; about two minutes on 2 CPU cores",
        cuts=(
            "A smoke test of the pipeline, not a result: d_model 32 models trained for 150 steps of 32 "
            "sequences, 256 held-out sequences. No number in this report should be read as a finding.",
        ),
        meaning=(
            "Tiny scale is a smoke test of the pipeline, not a result: its models train for 150 steps, so nearly "
            "every verdict is 'no', as expected. The claims are judged at cpu scale (`make run`) and at paper scale."
        ),
    ),
    "cpu": Scale(
        name="cpu",
        configs="cpu",
        seeds={
            "bijection_transformer": 3,
            "hmm_transformer": 3,
            "hmm_transformer_floor": 0,
            "hmm_late_attention_off_floor": 0,
        },
        overrides={
            "bijection_mlp": ("train.steps=1000",),
            "bijection_replacement_mlp": ("train.steps=1000", *CPU_REPLACEMENT_CURRICULUM),
            "hmm_mlp": ("train.steps=2000",),
            "hmm_mlp_floor": ("train.steps=2000",),
        },
        parallel=2,
        # Measured (bc62292, AMD EPYC with AVX-512), two single-threaded runs side by side on 2 cores.
        expected_s={
            "bijection_transformer": 490.0,
            "bijection_mlp": 80.0,
            "bijection_replacement_transformer": 550.0,
            "bijection_replacement_mlp": 80.0,
            "hmm_transformer": 2280.0,
            "hmm_mlp": 95.0,
            "hmm_mlp_floor": 85.0,
            "hmm_late_attention_off": 1500.0,
        },
        hardware="2 CPU cores: about 1 hour on a Zen 5 AMD EPYC, 100 minutes on an earlier AVX-512 one, about 2 hours on an AVX2-only one (measured)",
        cuts=(
            "Models of 0.17M-0.2M parameters (bijection: 4 layers, 4 heads, d_model 64; HMM: 6 layers, 4 heads, "
            "d_model 48, initial weights of std 0.04) instead of 2.7M-7.2M.",
            "3,000 steps (bijection) and 12,000 steps (HMM) with warm-up and cosine decay, instead of 100k-150k; "
            "the HMM's peak learning rate 5e-3 after 1,000 warm-up steps (the paper: 3e-4). The HMM model first sits "
            "on a plateau (it predicts the stationary distribution of T times the current emission column) and "
            "leaves it when heads that read the recent observations form; the step depends on the recipe and the "
            "seed: this recipe left it within the first third of training on 4 of 5 seeds measured (the runs table "
            "gives each run's step, and names a run that never left it).",
            "Soft targets (the exact posterior) for the bijection too; the HMM header on a 0.05 grid instead of 0.01.",
            "The MLP controls train 1,000 (bijection) and 2,000 (HMM) steps: they reach the context-free prior, "
            "the best any predictor that cannot see other tokens can do, within a few hundred.",
            "Seeds: 3 for the bijection transformer (ablations, seed overlay) and 3 for the HMM transformer (the "
            "paper: 5), whose claims are decided on the median of the seeds, with the range shown; 1 for the MLP "
            "controls and the late-attention variant. The step at which each HMM seed left its plateau is in the "
            "runs table, and a seed that never did is named there.",
            "The paper's numbers belong to the authors' task variants: bijection inputs drawn with replacement, and "
            "HMM rows floored at 0.05 on a 0.01 grid. At this scale the bijection transformer and MLP are trained on "
            "both bijection variants, and on the HMM only the MLP control (and the context-free prior) on the "
            "authors' variant, beside ours (no floor, grid 0.05); each claim row names the variant of every number.",
            "The bijection transformer with replacement (Fig 2) trains on a curriculum the paper does not use: for "
            "the first 1,500 steps an input copies an earlier one more often than by chance (repeat_rate 0.6 -> 0, "
            "half of the copies from the latest pair; the exact posterior is unchanged, and its MLP twin shares "
            "the stream). Without it the model stays at the uniform prediction for all 3,000 steps (measured): "
            "averaged over a repeated or a new input the exact posterior is uniform. One seed here (seed 0); seeds "
            "0 / 1 / 2 reach 0.0179 / 0.0197 / 0.0222 mae_bits (AMD EPYC).",
        ),
        meaning=(
            "CPU-scale verdicts: models of about 0.2M parameters trained for 3,000-12,000 steps, where the paper's "
            "claims are about 2.7M-7.1M-parameter models trained for 100k-150k steps. A verdict here says whether "
            "the claim already shows at this size; precision against the paper's numbers is judged at paper scale. "
            "What this scale cuts is listed in the report's last section."
        ),
    ),
    "paper": Scale(
        name="paper",
        configs="paper",
        seeds={"bijection_transformer": 3, "hmm_transformer": 5},
        overrides={},
        parallel=1,
        expected_s={"bijection": 8 * 3600.0, "hmm": 8 * 3600.0},
        hardware="one GPU (the paper: ~8 h per run on an RTX 4090; 16 runs); on 2 CPU cores ~19 h per bijection run, ~4 days per HMM run",
        warmup_steps=6,
        keep_final_weights_only=True,
        cuts=(
            "Nothing is cut. Beside the paper's protocol on our task variants (bijection without replacement; HMM "
            "rows without a floor), the bijection MLP control and every HMM preset also train on the authors' "
            "variants (with replacement; rows floored at 0.05 on the 0.01 grid), where the paper's numbers belong, "
            "and each claim is judged there.",
        ),
        meaning="Paper-scale verdicts: the paper's models, steps and seeds; its claims are judged at their own scale.",
    ),
}


def configs_folder(scale: Scale) -> Path:
    """The preset folder shipped with the package."""
    return Path(str(resources.files("windtunnel") / "configs" / scale.configs))


@dataclass(frozen=True)
class AnalysisGroup:
    """Runs analyzed together into ``out/analysis/<name>`` (``only``: those analyses; empty:
    every analysis of seeds of one configuration that applies)."""

    name: str
    presets: tuple[str, ...]
    only: tuple[str, ...] = ()


#: What is analyzed together: seeds of one model (averaged; named after the preset), and
#: models of one task variant (compared; named after the variant). A comparison group of which
#: a scale (or the slices run so far) trains one model only gets that model's per-position
#: analysis (``length_generalization``, which applies to one configuration) instead of Table 1.
GROUPS = (
    AnalysisGroup("bijection_transformer", ("bijection_transformer",)),
    AnalysisGroup("bijection_replacement_transformer", ("bijection_replacement_transformer",), ("calibration",)),
    AnalysisGroup("bijection", ("bijection_transformer", "bijection_mlp"), ("model_comparison", "seeds", "length_generalization")),
    AnalysisGroup(
        "bijection_with_replacement",
        ("bijection_replacement_transformer", "bijection_replacement_mlp"),
        ("model_comparison", "length_generalization"),
    ),
    AnalysisGroup("hmm_transformer", ("hmm_transformer",)),
    AnalysisGroup("hmm_mlp", ("hmm_mlp",), ("calibration", "value_manifold", "linear_probes")),
    AnalysisGroup(
        "hmm", ("hmm_transformer", "hmm_mlp", "hmm_late_attention_off"), ("model_comparison", "late_attention", "seeds", "length_generalization")
    ),
    AnalysisGroup("hmm_transformer_floor", ("hmm_transformer_floor",), ("layer_ablation", "length_generalization", "relabeling")),
    AnalysisGroup(
        "hmm_floor",
        ("hmm_transformer_floor", "hmm_mlp_floor", "hmm_late_attention_off_floor"),
        ("model_comparison", "late_attention", "length_generalization"),
    ),
)

#: The architectures study's tunnels (``configs/primitives/<tunnel>_<family>.toml``), one per
#: inference primitive of the paper's later versions, the binding one at two sizes: 4 stored
#: pairs, and 8, where a fixed-size state has to hold twice as much.
PRIMITIVE_TUNNELS = ("bijection", "hmm", "recall4", "recall8")
#: Its model families, in the order of the paper's table.
ARCHITECTURES = ("transformer", "mamba", "lstm", "mlp")


def _every_architecture(tunnels: tuple[str, ...]) -> tuple[tuple[Preset, ...], tuple[AnalysisGroup, ...], dict[str, int]]:
    """Every architecture on every tunnel (``configs/primitives/<tunnel>_<family>.toml``): the
    presets; each tunnel's four models compared (Table 1 per tunnel, from which the report's
    primitives table is built); the seeds at the CPU scale (three, one for Mamba, whose run takes
    5-13 times the others': the cuts say so)."""
    presets = tuple(Preset(f"{t}_{a}", f"{t}_{a}") for t in tunnels for a in ARCHITECTURES)
    groups = tuple(AnalysisGroup(t, tuple(f"{t}_{a}" for a in ARCHITECTURES), ("model_comparison",)) for t in tunnels)
    seeds = {f"{t}_{a}": 3 for t in tunnels for a in ARCHITECTURES if a != "mamba"}
    return presets, groups, seeds


ARCHITECTURE_PRESETS, ARCHITECTURE_GROUPS, CPU_PRIMITIVES_SEEDS = _every_architecture(PRIMITIVE_TUNNELS)

#: Wall seconds per run, two single-threaded runs side by side (for the ETA and for packing:
#: the Mamba runs start first): measured from a fresh clone of 541fc90 on an AMD EPYC (Zen 3).
CPU_PRIMITIVES_EXPECTED_S = {
    "bijection_transformer": 85.0, "hmm_transformer": 110.0, "recall4_transformer": 50.0, "recall8_transformer": 50.0,
    "bijection_mamba": 660.0, "hmm_mamba": 745.0, "recall4_mamba": 325.0, "recall8_mamba": 535.0,
    "bijection_lstm": 72.0, "hmm_lstm": 78.0, "recall4_lstm": 42.0, "recall8_lstm": 60.0,
    "bijection_mlp": 36.0, "hmm_mlp": 42.0, "recall4_mlp": 18.0, "recall8_mlp": 18.0,
}
CPU_PRIMITIVES_HARDWARE = "2 CPU cores: about 40 minutes on an AVX2 AMD EPYC (Zen 3)"
CPU_PRIMITIVES_CUTS = (
    "Models of 60k-90k parameters (transformers of 2 layers, d_model 48, 4 heads; the HMM's 3 layers), each control "
    "matched to its tunnel's transformer within 1%, instead of 2.7M-7.2M; 3,000 steps of batch 64 with warm-up and "
    "cosine decay, soft targets, for every architecture of a tunnel alike.",
    "Smaller tunnels: the bijection at V = 16 (the paper: 20); the HMM with S = M = 2 and K = 12 (the paper: 5, 5, 20), "
    "its header on the 0.05 grid; associative recall with 4 and 8 stored pairs of 16 keys and 16 values (the paper "
    "gives no size). Each transformer's depth and peak learning rate were chosen by measurement on seed 0 (docs/reproducing.md, "
    "the architectures study): 3 layers at 2e-3 learned recall late or not at all within 3,000 steps, 2 layers at 1e-3 learned it.",
    "Mamba with d_state 4 (the published 16): mambapy's parallel scan materializes [batch, length, d_inner, d_state], "
    "and a Mamba run already takes 5-6 times a transformer's time on a CPU. A smaller state is a handicap where state "
    "capacity matters (binding); the paper-scale presets keep 16.",
    "Three seeds for the transformer, the LSTM and the MLP, whose verdicts are decided on the median with the range "
    "over seeds shown; one for Mamba (a Mamba run takes 5-13 times theirs), whose interval is its 95% bootstrap "
    "interval over 2,048 held-out sequences: that does not cover the spread over seeds, so a Mamba verdict near a "
    "threshold could differ on another seed.",
)

_TINY_PRIMITIVES_TRAIN = (
    "train.steps=60",
    "train.batch_size=16",
    "train.warmup_steps=10",
    "train.eval_every=0",
    "train.checkpoint_every=30",
    "eval.n=128",
    "eval.bootstrap=100",
)

def _tiny_scale(configs: str, expected_s: Mapping[str, float], judged: str) -> Scale:
    """A study's smoke test: its CPU presets trained for 60 steps (``judged``: where its verdicts
    are judged instead)."""
    return Scale(
        name="tiny",
        configs=configs,
        seeds={},
        overrides={"*": _TINY_PRIMITIVES_TRAIN},
        parallel=2,
        expected_s=expected_s,
        hardware="any machine; about a minute on 2 CPU cores",
        cuts=("A smoke test of the pipeline, not a result: the CPU presets trained for 60 steps, 128 held-out "
              "sequences. No number in this report should be read as a finding.",),
        meaning=("Tiny scale is a smoke test of the pipeline, not a result: its models train for 60 steps, so its "
                 f"verdicts mean nothing. {judged}"),
    )


ARCHITECTURE_SCALES: dict[str, Scale] = {
    "tiny": _tiny_scale("primitives", {"bijection": 5.0, "hmm": 5.0, "recall4": 5.0, "recall16": 10.0},
                        "The table is judged at cpu scale (`make architectures`)."),
    "cpu": Scale(
        name="cpu",
        configs="primitives",
        seeds=CPU_PRIMITIVES_SEEDS,
        overrides={},
        parallel=2,
        expected_s=CPU_PRIMITIVES_EXPECTED_S,
        hardware=CPU_PRIMITIVES_HARDWARE,
        cuts=CPU_PRIMITIVES_CUTS,
    ),
}


#: The future-work study's tunnels (``windtunnel reproduce --only future_work``): what the paper
#: names as future work, with exact posteriors beyond its three primitives. Laplace accumulation
#: at order 0 (i.i.d. symbols) and order 1 (a Markov chain), and Gaussian filtering.
FUTURE_WORK_TUNNELS = ("dirichlet", "markov", "kalman")
FUTURE_WORK_PRESETS, FUTURE_WORK_GROUPS, CPU_FUTURE_WORK_SEEDS = _every_architecture(FUTURE_WORK_TUNNELS)
#: Wall seconds per run, two single-threaded runs side by side (for the ETA and for packing):
#: measured on an AMD EPYC (Zen 4), the three Mamba runs sharing the cores with a test run.
CPU_FUTURE_WORK_EXPECTED_S = {
    "dirichlet_transformer": 72.0, "markov_transformer": 155.0, "kalman_transformer": 120.0,
    "dirichlet_mamba": 750.0, "markov_mamba": 1510.0, "kalman_mamba": 710.0,
    "dirichlet_lstm": 51.0, "markov_lstm": 97.0, "kalman_lstm": 102.0,
    "dirichlet_mlp": 52.0, "markov_mlp": 97.0, "kalman_mlp": 98.0,
}
CPU_FUTURE_WORK_HARDWARE = "2 CPU cores: about 50 minutes on an AVX-512 AMD EPYC (Zen 4)"
CPU_FUTURE_WORK_CUTS = (
    "Models of about 60k parameters (transformers of 2 layers, d_model 48, 4 heads), each control matched to the "
    "transformer within 1%; 3,000 steps of batch 64 with warm-up and cosine decay, soft targets, for every "
    "architecture of a tunnel alike.",
    "Small tunnels: Dirichlet symbols over V = 5 (32 per sequence); an order-1 chain over V = 3 (64 symbols; "
    "Bondaschi et al. train binary chains of order 1-3 with far larger budgets); a Kalman bank of 4 systems of state "
    "dimension 2, 32 observations, the predictive on 32 buckets.",
    "Mamba with d_state 4 (the published 16), as in the architectures study, and one seed of it: its interval is "
    "its 95% bootstrap interval over 2,048 held-out sequences, not a spread over seeds.",
)

FUTURE_WORK_SCALES: dict[str, Scale] = {
    "tiny": _tiny_scale("primitives", {"dirichlet": 5.0, "markov": 8.0, "kalman": 6.0},
                        "The table is judged at cpu scale (`make future-work`)."),
    "cpu": Scale(
        name="cpu",
        configs="primitives",
        seeds=CPU_FUTURE_WORK_SEEDS,
        overrides={},
        parallel=2,
        expected_s=CPU_FUTURE_WORK_EXPECTED_S,
        hardware=CPU_FUTURE_WORK_HARDWARE,
        cuts=CPU_FUTURE_WORK_CUTS,
    ),
}


#: The model-selection study (``windtunnel reproduce --only model_selection``; arXiv 2607.19379):
#: per configuration of ``configs/model_selection``, the symbol modes it is trained in. Involutions
#: (relational) and rotations and multiplications (arithmetic) in every mode; the comparison of two
#: classes, involutions against 3-cycles, with integer symbols, by every architecture.
MODEL_SELECTION_MODES = {
    "involution": ("integer", "opaque", "fixed"),
    "rotation": ("integer", "opaque", "fixed"),
    "multiplication": ("integer", "opaque", "fixed"),
}
MODEL_SELECTION_PRESETS = (
    *(Preset(f"{task}_{mode}", f"{task}_transformer", (f"tunnel.symbols={mode}",))
      for task, modes in MODEL_SELECTION_MODES.items() for mode in modes),
    *(Preset(f"classes_{a}", f"classes_{a}") for a in ARCHITECTURES),
)
MODEL_SELECTION_GROUPS = (
    # Each transformer's seeds: its scores with the permutation reference, and relabeling where
    # it is a symmetry of the task (the analysis says why not elsewhere).
    *(AnalysisGroup(preset.name, (preset.name,), ("length_generalization", "relabeling"))
      for preset in MODEL_SELECTION_PRESETS if not preset.name.startswith("classes_")),
    AnalysisGroup("classes_transformer", ("classes_transformer",), ("length_generalization", "relabeling", "class_posterior")),
    AnalysisGroup("classes", tuple(f"classes_{a}" for a in ARCHITECTURES), ("model_comparison",)),
)
#: Wall seconds per run, two single-threaded runs side by side (for the ETA and for packing):
#: measured on an AMD EPYC (Zen 3).
CPU_MODEL_SELECTION_EXPECTED_S = {
    **{f"{task}_{mode}": 150.0 for task in ("involution", "rotation") for mode in MODEL_SELECTION_MODES[task]},
    **{f"multiplication_{mode}": 290.0 for mode in MODEL_SELECTION_MODES["multiplication"]},
    "classes_transformer": 360.0, "classes_lstm": 300.0, "classes_mlp": 150.0, "classes_mamba": 3600.0,
}
CPU_MODEL_SELECTION_HARDWARE = "2 CPU cores: about an hour on an AVX2 AMD EPYC (Zen 3; 57.5 min measured)"
CPU_MODEL_SELECTION_CUTS = (
    "Small domains: involutions and 3-cycles on Z_6, rotations and multiplications on Z_7, every input shown once "
    "(the paper does not state its sizes; its public sibling experiment works mod 17).",
    "Transformers of 2 layers, d_model 48, 4 heads (58k parameters) for one class, trained 6,000 steps (rotations, "
    "involutions) or 12,000 (multiplications: at 6,000 the multiplier's inverse was not found yet); of 3 layers (86k) "
    "for involutions against 3-cycles, 12,000 steps (2 layers did not learn the comparison); the controls matched to "
    "it within 1%. Batch 64 at peak learning rate 2e-3 with warm-up and cosine decay, soft targets. The paper: 2.8M "
    "parameters, AdamW 3e-4, 150k steps.",
    "Seeds: 3 for every transformer, the LSTM and the MLP, decided on the median with every seed's value shown. "
    "Mamba is left out at this scale (one run of 12,000 steps would take about an hour of the two cores); the tiny "
    "and paper scales train it.",
)

MODEL_SELECTION_SCALES: dict[str, Scale] = {
    "tiny": _tiny_scale("model_selection", {"involution": 5.0, "rotation": 5.0, "multiplication": 5.0, "classes": 6.0},
                        "The claims are judged at cpu scale (`make model-selection`)."),
    "cpu": Scale(
        name="cpu",
        configs="model_selection",
        seeds={preset.name: (0 if preset.name == "classes_mamba" else 3) for preset in MODEL_SELECTION_PRESETS},
        overrides={},
        parallel=2,
        expected_s=CPU_MODEL_SELECTION_EXPECTED_S,
        hardware=CPU_MODEL_SELECTION_HARDWARE,
        cuts=CPU_MODEL_SELECTION_CUTS,
        meaning=("CPU-scale verdicts: 58k-86k-parameter models on Z_6 and Z_7 trained for 6,000-12,000 steps, where "
                 "the paper's are 2.8M-parameter models trained for 150k steps on larger domains. A verdict here says "
                 "whether the finding already shows at this size."),
    ),
    "paper": Scale(
        name="paper",
        configs="model_selection_paper",
        seeds={preset.name: 3 for preset in MODEL_SELECTION_PRESETS},
        overrides={},
        parallel=1,
        expected_s={preset.name: (6 if preset.name == "classes_mamba" else 2) * 3600.0 for preset in MODEL_SELECTION_PRESETS},
        hardware="one GPU; on 2 CPU cores about 3 days per run",
        warmup_steps=6,
        keep_final_weights_only=True,
        cuts=("The paper's protocol as its public sibling experiment states it (AdamW 3e-4, batch 64, 150k steps, a "
              "6-layer, d_model 192 transformer of about 2.8M parameters, loss on the answers only); the domains "
              "(involutions and 3-cycles on Z_18, rotations and multiplications on Z_17, the sibling's modulus) are "
              "ours: the paper does not state its own.",),
        meaning="Paper-scale verdicts: the paper's model size, optimizer and steps; its claims are judged at their own scale.",
    ),
}


@dataclass(frozen=True)
class Study:
    """What a reproduction trains and analyzes (``windtunnel reproduce --only NAME``), at
    each scale it has."""

    name: str
    presets: tuple[Preset, ...]
    groups: tuple[AnalysisGroup, ...]
    scales: Mapping[str, Scale]
    why_not: str = ""  # why the scales it lacks are absent





#: Analyses that read a run's training history rather than its weights: not run at initialization.
HISTORY_ANALYSES = ("training_dynamics", "training_phases")


#: The phases study (``windtunnel reproduce --only phases``): when the error leaves its plateau
#: and when the attention frame forms, across depth, width and the size of the hypothesis space,
#: and under training knobs. Per tunnel (``configs/phases/<tunnel>.toml``, the grid's centre): the
#: depth x width plane at the centre's size, the size axis at the centre's depth and width, and
#: one knob at a time changed at the centre.
PHASES_DEPTHS = (1, 2, 3)
PHASES_WIDTHS = (32, 48, 64)  # d_model; 4 heads, so heads of width 8, 12, 16; d_mlp 4 x d_model
PHASES_SIZES = {
    "bijection": ("V", (8, 12, 16)),
    "hmm": ("S", (2, 3, 4)),  # S = M: as many observation symbols as states
}
PHASES_CENTRE = {"n_layers": 2, "d_model": 48, "bijection": 12, "hmm": 3}
#: Training knobs: the value each takes instead of the centre's (``configs/phases``), one at a time.
PHASES_KNOBS = {
    "bijection": {"init_std": "model.init_std=0.04", "lr": "train.lr=3e-3", "batch": "train.batch_size=32"},
    "hmm": {"init_std": "model.init_std=0.02", "lr": "train.lr=2e-3", "batch": "train.batch_size=32"},
}
PHASES_SEEDS = 5


def _size_overrides(tunnel: str, size: int) -> tuple[str, ...]:
    if tunnel == "bijection":
        return (f"tunnel.V={size}", f"tunnel.L={size - 1}")
    return (f"tunnel.S={size}", f"tunnel.M={size}")


def _shape_overrides(n_layers: int, d_model: int) -> tuple[str, ...]:
    return (f"model.n_layers={n_layers}", f"model.d_model={d_model}", f"model.d_mlp={4 * d_model}")


def phases_preset_name(tunnel: str, n_layers: int, d_model: int, size: int, knob: str = "") -> str:
    """``bijection_L2_d48_V12`` (a grid point); ``hmm_L2_d48_S3_lr`` (a knob changed at the centre)."""
    letter = PHASES_SIZES[tunnel][0]
    return f"{tunnel}_L{n_layers}_d{d_model}_{letter}{size}" + (f"_{knob}" if knob else "")


def _phases_presets() -> tuple[Preset, ...]:
    presets = []
    for tunnel, (_, sizes) in PHASES_SIZES.items():
        centre = PHASES_CENTRE[tunnel]
        points = [(n, d, centre) for n in PHASES_DEPTHS for d in PHASES_WIDTHS]
        points += [(PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"], s) for s in sizes if s != centre]
        for n, d, s in points:
            presets.append(Preset(phases_preset_name(tunnel, n, d, s), tunnel, (*_shape_overrides(n, d), *_size_overrides(tunnel, s))))
        n, d = PHASES_CENTRE["n_layers"], PHASES_CENTRE["d_model"]
        for knob, override in PHASES_KNOBS[tunnel].items():
            presets.append(Preset(phases_preset_name(tunnel, n, d, centre, knob), tunnel,
                                  (*_shape_overrides(n, d), *_size_overrides(tunnel, centre), override)))
    return tuple(presets)


PHASES_PRESETS = _phases_presets()
PHASES_GROUPS = tuple(AnalysisGroup(p.name, (p.name,), ("training_phases",)) for p in PHASES_PRESETS)
#: Wall seconds per run, two single-threaded runs side by side (for the ETA and for packing): the
#: median measured from a fresh clone on an AMD EPYC (Zen 3).
CPU_PHASES_EXPECTED_S = {"bijection": 24.0, "hmm": 43.0}
PHASES_CUTS = (
    "Transformers of 1-3 layers, d_model 32-64 (4 heads), 20k-150k parameters, trained for 1,200 (bijection) and "
    "1,500 (HMM) steps of batch 64 at a constant learning rate after 100 warm-up steps, soft targets: far from the "
    "paper's 2.7M-7.1M parameters and 100k steps. The phases measured are those of these models.",
    "Small tunnels: the bijection at V = 8, 12, 16; the HMM with S = M = 2, 3, 4 and K = 12 (the paper: 5, 5, 20), "
    "its header on the 0.05 grid. Depth and width are crossed at the centre's size (V = 12, S = 3); the size is "
    "varied at the centre's depth and width (2 layers, d_model 48); each knob is changed alone at the centre.",
    f"{PHASES_SEEDS} seeds per configuration; every number is given as the median with the seeds' range.",
)

PHASES_SCALES: dict[str, Scale] = {
    # The tiny scale keeps evaluations every 10 steps: the phases are read from them.
    "tiny": dataclasses.replace(
        _tiny_scale("phases", {"bijection": 4.0, "hmm": 5.0}, "The phases are measured at cpu scale (`make phases`)."),
        overrides={"*": (*_TINY_PRIMITIVES_TRAIN, "train.eval_every=10")},
    ),
    "cpu": Scale(
        name="cpu",
        configs="phases",
        seeds={preset.name: PHASES_SEEDS for preset in PHASES_PRESETS},
        overrides={},
        parallel=2,
        expected_s=CPU_PHASES_EXPECTED_S,
        hardware="2 CPU cores: about 50 minutes on an AVX2 AMD EPYC (Zen 3; 48.9 min measured)",
        cuts=PHASES_CUTS,
        meaning=("A measurement across small CPU-trained transformers, not a claim of the paper: how the plateau exit, "
                 "the frame's formation and the final geometry move with depth, width, the size of the hypothesis "
                 "space and three training knobs."),
    ),
}


STUDIES = {
    "claims": Study("claims", PRESETS, GROUPS, SCALES),
    "architectures": Study(
        "architectures", ARCHITECTURE_PRESETS, ARCHITECTURE_GROUPS, ARCHITECTURE_SCALES,
        why_not="its paper-scale presets (associative recall at the paper's size) are not written yet",
    ),
    "future_work": Study(
        "future_work", FUTURE_WORK_PRESETS, FUTURE_WORK_GROUPS, FUTURE_WORK_SCALES,
        why_not="the paper gives no scale for these tunnels: its presets are CPU-sized only",
    ),
    "model_selection": Study("model_selection", MODEL_SELECTION_PRESETS, MODEL_SELECTION_GROUPS, MODEL_SELECTION_SCALES),
    "phases": Study(
        "phases", PHASES_PRESETS, PHASES_GROUPS, PHASES_SCALES,
        why_not="the phases are a property of small models trained on CPUs: the study has no paper-scale presets",
    ),
}
