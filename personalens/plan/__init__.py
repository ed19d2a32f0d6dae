"""`personalens plan`: a dry run of a command's config, loading no model."""
