"""A VLM judge for rewards: what it sees of a trajectory (``context``), its rubric and messages (``rubric``), its
verdicts (``verdict``) and the client asking an OpenAI-compatible endpoint for them (``client``). The reward function
is ``rewards.judge.judge_reward``."""
