"""The table-and-page toolkit at the ground floor: the Table model, bootstrap and other
statistics, md / csv / tex rendering and writing, matplotlib helpers and self-contained HTML pages.
It imports nothing of the pipelines that use it."""
