"""`pipeprof bench repeat`'s verdict on its runs: do they give one answer? Rows of known content."""

import pandas as pd

from pipeprof.checks.bench import agreement, render_repeat


def runs(*answers):
    """One row per run: (side, resource, workers_low, workers_high)."""
    return pd.DataFrame(
        [
            {
                "run": i + 1,
                "group": "g",
                "wall_s": 130.0 + i,
                "answer_s": 120.0,
                "trials": 8,
                "num_workers": lo,
                "workers_low": lo,
                "workers_high": hi,
                "side": side,
                "resource": res,
                "also": "",
                "samples_per_s": 3000.0,
                "answer_share": 0.9,
                "holds": True,
                "folder": "x",
            }
            for i, (side, res, lo, hi) in enumerate(answers)
        ]
    )


def test_runs_that_name_one_side_and_resource_with_overlapping_ranges_agree():
    three = runs(("input", "cores", 14, 16), ("input", "cores", 12, 16), ("input", "cores", 14, 14))
    (a,) = agreement(three)
    assert a["same_side"] and a["same_resource"] and a["ranges_overlap"] and a["common_workers"] == "14-14"
    text = render_repeat(three)
    assert "3 runs agree" in text and "| 1 | g | 130 (120) | 8 | 14 (14-16) | input | cores |" in text


def test_a_flip_of_resource_or_ranges_that_do_not_meet_is_a_disagreement():
    (a,) = agreement(runs(("input", "cores", 14, 16), ("input", "handoff", 8, 10)))
    assert a["same_side"] and not a["same_resource"] and not a["ranges_overlap"]
    text = render_repeat(runs(("input", "cores", 14, 16), ("input", "handoff", 8, 10)))
    assert "DISAGREE" in text and "resource differs" in text and "do not overlap" in text
