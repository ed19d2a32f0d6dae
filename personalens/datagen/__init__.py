"""`personalens build`: new PersonaLens-style data made the way the paper made it (Section 2, Appendix A),
on our engines. Stages (interests, preferences, consistency, interactions, tasks, situations) each run as
batched, grammar-constrained generate calls whose results stream to Parquet under `<out_dir>/build/`;
`assemble` writes the official layout (profile/userN/..., task/<Domain>/task.jsonl) from them."""
