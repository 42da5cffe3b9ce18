"""``verl-mm-tools eval``: a model scored through the mm_tool loop with the tools, environments and rewards of
training, against an OpenAI-compatible endpoint or a checkpoint."""
