"""What the server's tests tune and ask: problems, landscapes, paths."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LANDSCAPES = (ROOT / "templates" / "attention" / "landscapes" / "attention_2x8x1024x64-fp16-causal_h200.json",
              ROOT / "tests" / "data" / "attention_4x8x512x64-fp16-causal_h200.json")
TUNED = (("2,8,1024,64", "fp16", {"causal": True}), ("4,8,512,64", "fp16", {"causal": True}))
UNTUNED = ("2,8,2048,64", "fp16", {"causal": True})  # answered by the rule from the tuned ones
