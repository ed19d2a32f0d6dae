"""PersonalBench: personalization from real chat histories (WildChat), stage by stage, with humans
in the loop (docs/personalbench.md). A sibling of `simulate` and `judge` on the same engine, store
and config layers."""
