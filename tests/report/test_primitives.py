"""The primitives table (`windtunnel reproduce --only architectures`): the verdict criterion
passes and fails where it should, on stated numbers and on models whose answer is known; the
study's presets keep one protocol per tunnel; and the tiny study runs end to end."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from fakes import typed_result, typed_results
from windtunnel.cli import main
from windtunnel.evaluation import EvalSet, evaluate
from windtunnel.report.primitives import (
    FAILS,
    PAPER,
    PAPER_PRIMITIVES,
    PRIMITIVES,
    REALIZES,
    cell_verdict,
    claim_rows,
    gap_closed,
    primitive_cells,
    position_wise_floor,
    primitive_sections,
    primitive_verdict,
    sits_at,
)
from windtunnel.reproduce import plan_analyses, plan_runs
from windtunnel.run_config import build_run_model
from windtunnel.studies import ARCHITECTURES, FUTURE_WORK_TUNNELS, PRIMITIVE_TUNNELS, STUDIES
from windtunnel.tunnels.base import primitive_of

# --- the criterion on stated numbers -------------------------------------------------------


def test_gap_closed_is_one_at_bayes_zero_at_the_prior_and_negative_past_it():
    assert gap_closed(0.0, 0.4) == 1.0 and gap_closed(0.4, 0.4) == 0.0 and gap_closed(0.8, 0.4) == -1.0
    with pytest.raises(ValueError, match="prior's error must be positive"):
        gap_closed(0.1, 0.0)


@pytest.mark.parametrize(
    "mae, kl, expected",
    [
        (0.0, 0.0, "realizes"),  # the exact posterior
        (0.024, 0.02, "realizes"),  # the paper's Mamba on the HMM (prior 0.40): 94% of the gap
        (0.4 * (1 - REALIZES), 0.01, "realizes"),  # exactly at the threshold
        (0.4 * (1 - REALIZES) + 1e-9, 0.01, "partly"),  # just past it
        (0.1, 0.05, "partly"),  # 75% of the gap
        (0.4 * (1 - FAILS), 0.4 * (1 - FAILS), "partly"),  # exactly at the failure line
        (0.4, 0.4, "fails"),  # the prior itself: a model that reads no context
        (0.0, 0.4, "fails"),  # the right entropy from the wrong distribution (a wrong point mass)
        (0.5, 0.0, "fails"),  # worse than the prior on the paper's metric
    ],
)
def test_a_cell_realizes_only_when_both_metrics_close_the_gap(mae, kl, expected):
    assert cell_verdict(mae, kl, 0.4, 0.4) == expected


def test_a_primitive_takes_its_worst_tunnel_and_the_paper_has_every_cell():
    assert primitive_verdict(["realizes", "realizes"]) == "realizes"
    with pytest.raises(ValueError, match="^a primitive's verdict needs at least one tunnel's$"):
        primitive_verdict([])
    assert primitive_verdict(["realizes", "partly"]) == "partly"
    assert primitive_verdict(["fails", "realizes"]) == "fails"
    with pytest.raises(ValueError):
        primitive_verdict([])
    assert {(a, p) for a in ARCHITECTURES for p in PAPER_PRIMITIVES} <= set(PAPER)
    # The v3 abstract: the transformer realizes all three, the MLP none, the LSTM accumulation only.
    assert all(PAPER["transformer", p].verdict == "realizes" for p in PAPER_PRIMITIVES)
    assert all(PAPER["mlp", p].verdict == "fails" for p in PAPER_PRIMITIVES)
    assert [PAPER["lstm", p].verdict for p in PAPER_PRIMITIVES] == ["realizes", "fails", "fails"]
    assert [PAPER["mamba", p].verdict for p in PAPER_PRIMITIVES] == ["realizes", "realizes", "partly"]
    # Beyond the paper, only what the literature reports, each naming its source.
    assert {p for _, p in PAPER} == set(PRIMITIVES)
    assert all(v.source != "paper" for (_, p), v in PAPER.items() if p not in PAPER_PRIMITIVES)


def test_a_cell_decided_on_the_median_says_when_its_seeds_disagree():
    """Three seeds, two of which learned the lookup and one of which never did: the median
    realizes the primitive, and the cell (and the verdict table) says the seeds split."""

    def stats(values):
        ordered = sorted(values)
        return {"median": ordered[1], "min": ordered[0], "max": ordered[2]}

    maes, kls = [0.25, 0.26, 3.07], [0.18, 0.22, 3.06]
    row = {"mae_bits": stats(maes), "kl_bits": stats(kls), "prior": {"mae_bits": 3.25, "kl_bits": 3.25},
           "per_run": [{"mae_bits": m, "kl_bits": k} for m, k in zip(maes, kls)]}
    comparison = {"training_horizon": 4, "primitive": "random-access binding", "tunnel": {"name": "assoc_recall", "n_pairs": 8},
                  "tunnel_label": "assoc_recall (n_pairs = 8)",
                  "models": {"transformer": {"n_runs": 3, "n_parameters": 10, "horizons": {"4": row}}}}
    _, (cell,) = primitive_cells(typed_result("model_comparison", comparison))
    assert (cell.verdict, cell.seed_verdicts, cell.seeds_split) == ("realizes", ("realizes", "realizes", "fails"), "2 realize, 1 fails")
    assert (cell.interval, cell.mae_range) == ("seeds", (0.25, 3.07))
    verdicts, numbers, _, _ = primitive_sections(typed_results({"recall8": {"model_comparison": comparison}}), Path("/nonexistent"))
    assert verdicts.tables[0].rows[0][3] == "realizes (seeds split on assoc_recall (n_pairs = 8): 2 realize, 1 fails) / paper: realizes (agrees)"
    assert "3 seeds, which split: 2 realize, 1 fails" in numbers.tables[0].rows[0][4]
    unanimous = dict(row, per_run=row["per_run"][:2], mae_bits=stats([0.25, 0.25, 0.26]))
    unanimous_comparison = dict(comparison, models={"transformer": {"n_runs": 2, "n_parameters": 10, "horizons": {"4": unanimous}}})
    _, (cell,) = primitive_cells(typed_result("model_comparison", unanimous_comparison))
    assert cell.seeds_split == ""


# --- the criterion on predictors whose answer is known -------------------------------------


def _comparison(tunnel, predictors: dict, n: int = 512) -> dict:
    """A saved model_comparison result, as the analysis writes it, for predictors scored by
    `evaluate` on held-out episodes of `tunnel` (one run each, with bootstrap intervals)."""
    eval_set = EvalSet.draw(tunnel, horizon=tunnel.horizon, n=n, batch_size=n, seed=7)
    models = {}
    for name, predictor in predictors.items():
        scores = evaluate(predictor, eval_set, tunnel=tunnel, bootstrap=200, seed=0)
        row = {m: {"median": scores[m], "min": scores[m], "max": scores[m]} for m in ("mae_bits", "kl_bits")}
        row["per_run"] = [{m: scores[m] for m in ("mae_bits", "kl_bits")} | {f"{m}_ci": scores[f"{m}_ci"] for m in ("mae_bits", "kl_bits")}]
        row["prior"] = {m: scores["prior"][m] for m in ("mae_bits", "kl_bits")}
        if "position_wise" in scores:
            row["position_wise"] = {m: scores["position_wise"][m] for m in ("mae_bits", "kl_bits")}
        models[name] = {"n_runs": 1, "n_parameters": 0, "horizons": {str(tunnel.horizon): row}}
    return {"training_horizon": tunnel.horizon, "models": models, "primitive": primitive_of(tunnel), "tunnel": {"name": tunnel.name},
            "tunnel_label": tunnel.label()}


@pytest.mark.parametrize("config", ["bijection", "hmm", "assoc_recall", "dirichlet", "markov", "kalman"])
def test_the_exact_posterior_realizes_and_the_context_free_prior_fails(config):
    """Oracles from outside the criterion: the exact posterior the tunnel computes (float64,
    brute-force-checked in each tunnel's tests) must realize the primitive; the posterior
    averaged over every sequence at each position (what a model that reads no context can
    best do) must fail it."""
    from windtunnel.run_config import run_config_from_mapping

    tunnel = run_config_from_mapping({"tunnel": {"name": config}, "model": {"kind": "transformer"}}).tunnel
    mean_posterior = tunnel.sample(4096, generator=torch.Generator().manual_seed(1)).posterior.mean(0)  # [P, C]

    def exact(episode):
        return episode.posterior

    def context_free(episode):
        return mean_posterior.expand_as(episode.posterior)

    prior, cells = primitive_cells(typed_result("model_comparison", _comparison(tunnel, {"mlp": context_free, "transformer": exact})))
    verdicts = {cell.architecture: cell.verdict for cell in cells}
    assert [cell.architecture for cell in cells] == ["transformer", "mlp"]  # the paper's order
    assert verdicts == {"transformer": "realizes", "mlp": "fails"}
    assert cells[0].interval == "95% bootstrap" and cells[0].mae_range[0] <= cells[0].mae_bits <= cells[0].mae_range[1]


@pytest.mark.parametrize("config", ["dirichlet", "kalman"])
def test_the_mlp_claim_holds_at_the_closed_form_floor_and_fails_at_the_prior_or_below_the_floor(config):
    """The floor a model that mixes no positions can reach, computed by the tunnel in closed
    form (checked against scipy in its tests), is a predictor here: as the MLP it sits at the
    floor; the context-free prior (which ignores the token that is evidence) and the exact
    posterior (which reads what a position-wise model cannot) do not."""
    from windtunnel.run_config import run_config_from_mapping

    tunnel = run_config_from_mapping({"tunnel": {"name": config}, "model": {"kind": "transformer"}}).tunnel
    prior_of = tunnel.prior_predictive

    def exact(episode):
        return episode.posterior

    def context_free(episode):
        return prior_of(len(episode.positions)).expand_as(episode.posterior)

    for mlp, holds in ((tunnel.position_wise_predictive, "holds"), (context_free, "does not hold"), (exact, "does not hold")):
        comparison = typed_result("model_comparison", _comparison(tunnel, {"transformer": exact, "mlp": mlp}))
        floor = position_wise_floor(comparison)
        prior, cells = primitive_cells(comparison)
        assert floor is not None and floor["kl_bits"] < prior["kl_bits"] - 0.1 * prior["kl_bits"]  # the token is evidence
        rows = claim_rows(tunnel.label(), prior, floor, cells)
        assert [row[2] for row in rows] == ["holds", holds], rows
        assert "its position-wise floor (closed form)" in rows[1][1]


def test_sits_at_needs_both_metrics_within_a_tenth_of_the_prior():
    prior, floor = {"mae_bits": 1.0, "kl_bits": 2.0}, {"mae_bits": 0.5, "kl_bits": 1.0}
    assert sits_at({"mae_bits": 0.59, "kl_bits": 1.19}, floor, prior)
    assert sits_at({"mae_bits": 0.41, "kl_bits": 0.81}, floor, prior)
    assert not sits_at({"mae_bits": 0.61, "kl_bits": 1.0}, floor, prior)  # mae off by 0.11 > 0.1
    assert not sits_at({"mae_bits": 0.5, "kl_bits": 0.79}, floor, prior)  # kl below the floor by 0.21 > 0.2
    # Exactly a tenth of the prior away on both (0.1 and 0.2 are the products 0.1 x 1.0 and 0.1 x 2.0): within.
    assert sits_at({"mae_bits": 0.1, "kl_bits": 0.2}, {"mae_bits": 0.0, "kl_bits": 0.0}, prior)


@pytest.mark.parametrize("verdict, claim", [("realizes", "holds"), ("partly", "does not hold"), ("fails", "does not hold")])
def test_the_transformer_claim_holds_only_where_it_realizes_the_primitive(verdict, claim):
    from windtunnel.report.primitives import PrimitiveCell

    cell = PrimitiveCell("transformer", 1, 10, 0.1, 0.1, (0.1, 0.1), (0.1, 0.1), "95% bootstrap", 0.9, verdict)
    (row,) = claim_rows("b", {"mae_bits": 1.0, "kl_bits": 1.0}, None, [cell])
    assert row[1:3] == ["the transformer matches the exact posterior", claim]


# --- the study's plan ------------------------------------------------------------------------


def _n_parameters(config) -> int:
    return sum(p.numel() for p in build_run_model(config).parameters())


@pytest.mark.parametrize(("name", "tunnels", "primitives"), [
    ("architectures", PRIMITIVE_TUNNELS, PAPER_PRIMITIVES),
    ("future_work", FUTURE_WORK_TUNNELS, ("Laplace accumulation", "Gaussian filtering")),
])
def test_the_cpu_study_trains_every_architecture_on_every_tunnel_under_one_protocol(tmp_path, name, tunnels, primitives):
    study = STUDIES[name]
    jobs = plan_runs(study.scales["cpu"], tmp_path, study.presets)
    configs = {job.preset: job.resolved() for job in jobs if job.name.endswith("_seed0")}
    seeds = {job.name.rsplit("_seed", 1)[1] for job in jobs if job.preset == f"{tunnels[1]}_transformer"}
    assert seeds == {"0", "1", "2"} and [job.preset for job in jobs].count(f"{tunnels[1]}_mamba") == 1
    assert set(configs) == {f"{t}_{a}" for t in tunnels for a in ARCHITECTURES}
    for tunnel in tunnels:
        reference = configs[f"{tunnel}_transformer"]
        n_reference = _n_parameters(reference)
        for family in ARCHITECTURES[1:]:
            config = configs[f"{tunnel}_{family}"]
            assert (config.tunnel, config.train, config.eval) == (reference.tunnel, reference.train, reference.eval)
            assert config.model.matched_to == reference.model and config.model.d_model == reference.model.d_model
            n = _n_parameters(config)
            assert abs(n - n_reference) <= 0.01 * n_reference, (tunnel, family, n, n_reference)
    assert {primitive_of(configs[f"{t}_transformer"].tunnel) for t in tunnels} == set(primitives)
    sizes = [configs[f"{t}_transformer"].tunnel.n_pairs for t in tunnels if t.startswith("recall")]
    assert not sizes or (len(sizes) == 2 and sizes[0] < sizes[1])
    assert [group.name for group, _ in plan_analyses(jobs, study.groups)] == list(tunnels)


def test_an_unknown_study_or_a_scale_it_lacks_is_one_line_and_writes_nothing(tmp_path, capsys):
    assert main(["reproduce", "--only", "everything", "--out", str(tmp_path / "a")]) == 2
    assert "unknown --only 'everything'; choose from: claims, architectures, future_work" in capsys.readouterr().err
    assert main(["reproduce", "--scale", "paper", "--only", "architectures", "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "--only architectures has no --scale paper" in err and "choose from: tiny, cpu" in err
    assert list(tmp_path.iterdir()) == []


# --- end to end at the tiny scale ------------------------------------------------------------


class _Rows(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.headings: list[str] = []
        self._cell: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th", "h2"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(self._cell.strip())
        if tag == "h2" and self._cell is not None:
            self.headings.append(self._cell.strip())
        self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


@pytest.mark.slow
def test_the_tiny_study_trains_compares_and_reports_every_architecture_on_every_primitive(tmp_path, capsys):
    out = tmp_path / "arch"
    assert main(["reproduce", "--scale", "tiny", "--only", "architectures", "--out", str(out)]) == 0
    manifest = json.loads((out / "reproduce.json").read_text())
    assert (manifest["study"], manifest["scale"], manifest["stage"]) == ("architectures", "tiny", "done")
    assert manifest["command"] == "windtunnel reproduce --scale tiny --only architectures --out arch"  # a temporary folder: its name
    for tunnel in PRIMITIVE_TUNNELS:
        result = json.loads((out / "analysis" / tunnel / "model_comparison.json").read_text())
        assert list(result["models"]) == list(ARCHITECTURES) and result["primitive"] in PRIMITIVES
        assert all(model["n_parameters"] > 0 for model in result["models"].values())
    page = _Rows()
    page.feed((out / "report" / "index.html").read_text())
    assert page.headings[1:5] == ["Which architecture realizes which primitive", "The numbers per tunnel",
                                  "The claims per tunnel", "Per-position curves"]
    verdicts = next(i for i, row in enumerate(page.rows) if row[:1] == ["architecture"])
    assert page.rows[verdicts] == ["architecture", *PAPER_PRIMITIVES]
    body = page.rows[verdicts + 1: verdicts + 1 + len(ARCHITECTURES)]
    assert [row[0] for row in body] == list(ARCHITECTURES)
    assert all("/ paper: " in cell for row in body for cell in row[1:])
    # The MLP sees one token: at a query it cannot know what was stored, so it fails binding
    # whatever it learned (its best is the context-free prior).
    assert body[-1][3].startswith("fails")
    numbers = next(i for i, row in enumerate(page.rows) if row[:3] == ["primitive", "tunnel", "architecture"])
    model_rows = [row for row in page.rows[numbers + 1:] if len(row) == 7 and row[2] in ARCHITECTURES]
    assert len(model_rows) == len(PRIMITIVE_TUNNELS) * len(ARCHITECTURES)
    # Random initial weights realize nothing: the criterion fails every one of them.
    assert all(row[5].startswith("fails") for row in model_rows), [row[5] for row in model_rows]
    # The runs table has no HMM-plateau column (a claims-study preset's), and every curve is drawn.
    runs_header = next(row for row in page.rows if row[:2] == ["run", "model"])
    assert runs_header[-1] == "trained on", runs_header
    markdown = (out / "report" / "report.md").read_text()
    assert "figure missing" not in markdown and markdown.count("](figures/") == len(PRIMITIVE_TUNNELS)

    # Resuming as the other study, and a rebuild from the saved folder alone.
    assert main(["reproduce", "--scale", "tiny", "--out", str(out), "--resume"]) == 2
    assert "holds a reproduction of --only architectures, not claims" in capsys.readouterr().err
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("*.safetensors", "report", ".lock"))
    assert main(["report", str(copy)]) == 0
    written = re.compile(r"^- \*\*written:\*\* .*$", re.M)  # the one line that says when it was written
    original, rebuilt = ((folder / "report" / "report.md").read_text() for folder in (out, copy))
    assert written.sub("", rebuilt) == written.sub("", original)
    assert "recall" in original and "context-free prior" in original


def test_the_primitive_tables_read_every_cell_from_hand_written_results(tmp_path):
    """Two tunnels, three architectures (one trained on each tunnel only), the initial weights
    beside, one figure on disk: every cell of both tables, worked by hand. The share of the gap
    is the smaller of (prior - error) / prior over mae_bits and kl_bits; one seed's interval is
    its run's bootstrap interval."""

    def row(mae, kl, prior=2.0):
        return {"mae_bits": {"median": mae, "min": mae, "max": mae}, "kl_bits": {"median": kl, "min": kl, "max": kl},
                "prior": {"mae_bits": prior, "kl_bits": prior},
                "per_run": [{"mae_bits": mae, "kl_bits": kl, "mae_bits_ci": [mae * 0.9, mae * 1.1], "kl_bits_ci": [kl * 0.8, kl * 1.2]}]}

    def comparison(primitive, tunnel, models, h):
        label = {"bijection": "bijection (V = 8)", "hmm": "hmm (S = 5, M = 5, K = 20)"}[tunnel["name"]]  # the tunnels' own words
        return {"training_horizon": h, "primitive": primitive, "tunnel": tunnel, "tunnel_label": label,
                "models": {name: {"n_runs": 1, "n_parameters": n, "horizons": {str(h): r}} for name, (n, r) in models.items()}}

    bijection = {"name": "bijection", "V": 8, "L": 7}
    hmm = {"name": "hmm", "S": 5, "M": 5, "K": 20, "grid": 0.05}
    results = {
        "bijection": {"model_comparison": comparison("belief accumulation", bijection,
                                                     {"transformer": (12345, row(0.01, 0.02)), "mlp": (12400, row(1.9, 1.8))}, 7)},
        "hmm": {"model_comparison": comparison("belief transport", hmm,
                                               {"transformer": (20000, row(0.05, 0.04)), "lstm": (19990, row(1.0, 0.9))}, 20)},
    }
    at_init = {group: {"model_comparison": comparison(r["model_comparison"]["primitive"], r["model_comparison"]["tunnel"],
                                                      {m: (1, row(2.0, 2.0)) for m in r["model_comparison"]["models"]},
                                                      r["model_comparison"]["training_horizon"])}
               for group, r in results.items()}
    (tmp_path / "hmm").mkdir()
    (tmp_path / "hmm" / "model_comparison.png").write_bytes(b"")
    verdicts, numbers, claims, curves = primitive_sections(typed_results(results), tmp_path, typed_results(at_init))
    assert verdicts.tables[0].columns == ["architecture", *PAPER_PRIMITIVES]
    assert verdicts.tables[0].rows == [
        ["transformer", "realizes / paper: realizes (agrees)", "realizes / paper: realizes (agrees)", "not trained / paper: realizes"],
        ["mlp", "fails / paper: fails (agrees)", "not trained / paper: fails", "not trained / paper: fails"],
        ["lstm", "not trained / paper: realizes", "partly / paper: fails (differs)", "not trained / paper: fails"],
    ]
    assert numbers.tables[0].columns[:3] == ["primitive", "tunnel", "architecture"]
    assert numbers.tables[0].rows == [
        ["belief accumulation", "bijection (V = 8)", "transformer", "12,345",
         "realizes: mae 0.01 [0.009, 0.011], kl 0.02 [0.016, 0.024] (1 seed; 99% of the gap)", "fails (0%)",
         "0.007 mae_bits (bijection V = 20)"],
        ["belief accumulation", "bijection (V = 8)", "mlp", "12,400",
         "fails: mae 1.9 [1.71, 2.09], kl 1.8 [1.44, 2.16] (1 seed; 5% of the gap)", "fails (0%)", "1.85 mae_bits (bijection V = 20)"],
        ["belief accumulation", "bijection (V = 8)", "context-free prior", None, "mae 2, kl 2", None, None],
        ["belief transport", "hmm (S = 5, M = 5, K = 20)", "transformer", "20,000",
         "realizes: mae 0.05 [0.045, 0.055], kl 0.04 [0.032, 0.048] (1 seed; 97% of the gap)", "fails (0%)",
         "7.5e-5 mae_bits (HMM, K = 20)"],
        ["belief transport", "hmm (S = 5, M = 5, K = 20)", "lstm", "19,990",
         "partly: mae 1 [0.9, 1.1], kl 0.9 [0.72, 1.08] (1 seed; 50% of the gap)", "fails (0%)", '"fails"; no number published'],
        ["belief transport", "hmm (S = 5, M = 5, K = 20)", "context-free prior", None, "mae 2, kl 2", None, None],
    ]
    assert (numbers.title, numbers.text) == ("The numbers per tunnel", "Each architecture's error on each tunnel, with its parameter count.")
    # No closed-form floor in these results: the MLP is held to the prior (1.9 vs 2: within 10% of 2; 1.8 too).
    assert claims.tables[0].rows == [
        ["bijection (V = 8)", "the transformer matches the exact posterior", "holds",
         "closes 99% of the prior's gap (needs 90% on both metrics)"],
        ["bijection (V = 8)", "the MLP sits at the context-free prior (no closed-form floor)", "holds",
         "mae 1.9 against 2, kl 1.8 against 2 (within 10% of the prior's 2 and 2 on both)"],
        ["hmm (S = 5, M = 5, K = 20)", "the transformer matches the exact posterior", "holds",
         "closes 97% of the prior's gap (needs 90% on both metrics)"],
    ]
    assert [(f.path, f.title) for f in curves.figures] == [
        (tmp_path / "hmm" / "model_comparison.png", "belief transport: hmm (S = 5, M = 5, K = 20)")]
    # Initial weights that close half the gap read "partly (50%)"; an architecture outside the
    # known order (a plug-in) is listed after the known ones.
    at_init["hmm"]["model_comparison"]["models"]["lstm"]["horizons"]["20"] = row(1.0, 1.0)
    results["hmm"]["model_comparison"]["models"]["plugin_net"] = {"n_runs": 1, "n_parameters": 20001, "horizons": {"20": row(1.0, 0.9)}}
    _, numbers, _, _ = primitive_sections(typed_results(results), tmp_path, typed_results(at_init))
    hmm_rows = [r for r in numbers.tables[0].rows if r[0] == "belief transport"]
    assert [r[2] for r in hmm_rows] == ["transformer", "lstm", "plugin_net", "context-free prior"]
    assert hmm_rows[1][5] == "partly (50%)"
    assert curves.figures[0].caption == "Per-position |entropy error| of each architecture, hmm (S = 5, M = 5, K = 20)."
    (nothing,) = primitive_sections({}, tmp_path)
    assert nothing.title == "Primitives" and not nothing.tables


def test_a_cell_names_its_seed_count_and_a_share_just_below_zero_reads_0_percent():
    from windtunnel.report.primitives import PrimitiveCell, _cell_text

    def cell(n_runs, closed):
        return PrimitiveCell("lstm", n_runs, 10, 0.5, 0.25, (0.4, 0.6), (0.2, 0.3), "seeds", closed, "fails")

    assert "(2 seeds; 50% of the gap)" in _cell_text(cell(2, 0.5))
    assert "(1 seed; " in _cell_text(cell(1, 0.5))
    # Rounded to -0.0, the share would print as "-0%": a model a hair worse than the prior reads 0%.
    assert _cell_text(cell(3, -0.001)).endswith("(3 seeds; 0% of the gap)")
    assert _cell_text(cell(3, 0.1251)).endswith("(3 seeds; 13% of the gap)")  # 12.51%, not a tie


def test_the_initial_weights_column_shows_a_share_a_hair_below_zero_as_0_percent(tmp_path):
    from fakes import typed_results as typed

    def comparison(mae):
        result = {"mae_bits": {"median": mae, "min": mae, "max": mae}, "kl_bits": {"median": mae, "min": mae, "max": mae},
                  "prior": {"mae_bits": 1.0, "kl_bits": 1.0},
                  "per_run": [{"mae_bits": mae, "kl_bits": mae, "mae_bits_ci": [mae, mae], "kl_bits_ci": [mae, mae]}]}
        return {"g": {"model_comparison": {"training_horizon": 4, "primitive": "belief accumulation",
                                           "tunnel": {"name": "bijection", "V": 4}, "tunnel_label": "b",
                                           "models": {"gru": {"n_runs": 1, "n_parameters": 9, "horizons": {"4": result}}}}}}

    verdicts, numbers, _, _ = primitive_sections(typed(comparison(0.1)), tmp_path, typed(comparison(1.001)))
    (row,) = [r for r in numbers.tables[0].rows if r[2] == "gru"]
    assert row[5] == "fails (0%)"
    # An architecture the paper did not train, on one of the paper's primitives; the others blank.
    (gru,) = [r for r in verdicts.tables[0].rows if r[0] == "gru"]
    assert gru[1].endswith(" / paper: not in the paper"), gru


def test_groups_without_a_declared_primitive_are_left_out_and_tunnels_sort_by_group_within_a_primitive(tmp_path):
    """A group with no model comparison, or one whose tunnel declares no primitive of the table,
    has no row (and the groups after it still do); two tunnels of one primitive are ordered by
    their group's name, not by their label."""

    def comparison(primitive, label):
        result = {"mae_bits": {"median": 0.1, "min": 0.1, "max": 0.1}, "kl_bits": {"median": 0.1, "min": 0.1, "max": 0.1},
                  "prior": {"mae_bits": 1.0, "kl_bits": 1.0},
                  "per_run": [{"mae_bits": 0.1, "kl_bits": 0.1, "mae_bits_ci": [0.09, 0.11], "kl_bits_ci": [0.09, 0.11]}]}
        return {"model_comparison": {"training_horizon": 4, "primitive": primitive, "tunnel": {"name": "bijection", "V": 4},
                                     "tunnel_label": label,
                                     "models": {"lstm": {"n_runs": 1, "n_parameters": 9, "horizons": {"4": result}}}}}

    results = {"a_no_comparison": {}, "b_copying": comparison("copying", "copy (V = 4)"),
               "c_first": comparison("belief accumulation", "z label"), "d_second": comparison("belief accumulation", "a label")}
    results = {group: typed_results({group: analyses})[group] if analyses else {} for group, analyses in results.items()}
    _, numbers, _, _ = primitive_sections(results, tmp_path)
    labels = [row[1] for row in numbers.tables[0].rows if row[2] == "lstm"]
    assert labels == ["z label", "a label"]
    (nothing,) = primitive_sections({"a_no_comparison": {}, "b_copying": results["b_copying"]}, tmp_path)
    assert nothing.text == "No tunnel of this reproduction declares an inference primitive: nothing to tabulate."


@pytest.mark.slow
def test_the_tiny_future_work_study_reports_its_two_primitives_and_the_claims_per_tunnel(tmp_path):
    out = tmp_path / "future"
    assert main(["reproduce", "--scale", "tiny", "--only", "future_work", "--out", str(out)]) == 0
    page = _Rows()
    page.feed((out / "report" / "index.html").read_text())
    verdicts = next(i for i, row in enumerate(page.rows) if row[:1] == ["architecture"])
    assert page.rows[verdicts] == ["architecture", "Laplace accumulation", "Gaussian filtering"]
    body = {row[0]: row[1:] for row in page.rows[verdicts + 1: verdicts + 1 + len(ARCHITECTURES)]}
    assert "/ Bondaschi et al.: realizes" in body["mamba"][0] and body["lstm"][0].endswith("/ none published")
    # The closed-form floor is a row of the numbers table for the two tunnels that have one.
    floors = [row[1] for row in page.rows if len(row) == 7 and row[2] == "position-wise floor (closed form)"]
    assert [label.split(" ")[0] for label in floors] == ["dirichlet", "kalman"]
    claims = [row for row in page.rows if len(row) == 4 and row[1].startswith("the ")]
    assert len(claims) == 2 * len(FUTURE_WORK_TUNNELS) and all(row[2] in ("holds", "does not hold") for row in claims)
    markov_mlp = next(row for row in claims if row[0].startswith("markov") and "MLP" in row[1])
    assert "the context-free prior (no closed-form floor)" in markov_mlp[1]
    saved = json.loads((out / "analysis" / "kalman" / "model_comparison.json").read_text())
    assert "position_wise" in saved["models"]["mlp"]["horizons"]["32"]
