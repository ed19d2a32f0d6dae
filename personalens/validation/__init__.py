"""The paper's validation of the benchmark: data statistics (Table 1, Tables 6-9, Figure 3) and the
lexical diversity of dialogues (Table 10). Reads through the data and store layers, writes through
the report layer's renderers (docs/validation.md)."""
