"""``factory runs --compare``: two replay forks of the same tasks, the second verbose; it says the second drifted."""

from __future__ import annotations

import json

from tests._runs import TASKS, fork_run

SHORT = ["Final: 42", "Final: 41", "42.\nFinal: 42", "Final: 40", "Final: 156", "Final: 146", "156.\nFinal: 156",
         "Final: 144"]
PADDING = ("Great question! Let me walk through this carefully, step by step, so that nothing is missed. "
           "First, I restate the problem; then I work it out; finally I summarise. ")


def replies(texts: list[str]) -> list[dict]:
    """Four replies per arithmetic task (a branch's seed picks one)."""
    return [{"prompt_contains": "17 + 25" if i < 4 else "12 * 13", "response": {"text": text}}
            for i, text in enumerate(texts)]


def test_runs_compare_says_the_verbose_fork_drifted(cli, tmp_path, replay_file):
    db = tmp_path / "runs.duckdb"
    fork_run(db, replay_file(replies(SHORT), "short.jsonl"), run_id="a", tasks=TASKS[:2])
    fork_run(db, replay_file(replies([PADDING * (1 + i % 3) + text for i, text in enumerate(SHORT)]), "long.jsonl"),
             run_id="b", tasks=TASKS[:2])
    result = cli("runs", "--db", db, "--compare", "a", "b")
    assert result.exit_code == 0, result.output
    assert "b drifted: final answers longer" in result.stdout
    found = json.loads(cli("runs", "--db", db, "--compare", "a", "b", "--json").stdout)
    assert found["drifted"] and found["branches"] == [8, 8]
    assert found["mean_length"][1] > 10 * found["mean_length"][0] and found["length_z"] > 2.5
    assert found["score_kl"] is not None and all(score is not None for score in found["mean_score"])
    same = json.loads(cli("runs", "--db", db, "--compare", "a", "a", "--json").stdout)
    assert not same["drifted"] and same["length_kl"] == 0 and same["score_kl"] == 0
    missing = cli("runs", "--db", db, "--compare", "a", "nope")
    assert missing.exit_code == 2 and "no run 'nope'" in missing.stderr
