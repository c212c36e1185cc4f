"""Recomputes tests/fixtures/m3_tiny/dspark_parity.json for the bundled draft against the bundled
target as they are now, on the CPU in float32, with the fixture's own cases (contexts and anchors).

train_dspark.py writes the fixture when it trains a draft. When the target is retrained and the
draft is kept (tools/train_tiny/README.md, the vision-and-tools round), the draft reads new hidden
states, embeddings and lm_head, so its logits change: this script recomputes what the C++ draft must
reproduce (dspark_parity_test), with the same PyTorch forward (dspark_model.py) and nothing trained.

    python3 tools/train_tiny/dspark_fixture.py [--target-dir models/m3-tiny] [--fixture PATH]

Needs torch only (Debian's python3-torch is enough); the checkpoints are read without the
safetensors package.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dspark_model as dm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target-dir", default="models/m3-tiny")
    ap.add_argument("--draft-dir", default="", help="default <target-dir>/dspark")
    ap.add_argument("--fixture", default="tests/fixtures/m3_tiny/dspark_parity.json")
    a = ap.parse_args()
    with open(a.fixture) as f:
        old = json.load(f)
    convention = old["convention"]
    draft, dcfg = dm.load_draft(a.draft_dir or os.path.join(a.target_dir, "dspark"))
    if dcfg.get("dspark_target_hidden_convention", convention) != convention:
        raise SystemExit("the fixture's convention %s is not the draft's %s" % (
            convention, dcfg["dspark_target_hidden_convention"]))
    target, _ = dm.load_target(a.target_dir)
    cases = [(c["name"], c["context_tokens"], c["anchor"]) for c in old["cases"]]
    out = dict(old)
    out["note"] = ("computed by tools/train_tiny/dspark_fixture.py (dspark_model.py's forward) in PyTorch "
                   "float32 on the CPU")
    out["cases"] = dm.parity_cases(target, draft, dcfg, convention, cases)
    changed = sum(o["token"] != n["token"] for c0, c1 in zip(old["cases"], out["cases"])
                  for o, n in zip(c0["slots"], c1["slots"]))
    with open(a.fixture, "w") as f:
        json.dump(out, f)
    print("wrote %s: %d cases, %d of %d greedy draft tokens differ from before" % (
        a.fixture, len(cases), changed, sum(len(c["slots"]) for c in out["cases"])))


if __name__ == "__main__":
    main()
