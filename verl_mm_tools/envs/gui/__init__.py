"""GUI environments: pages in an isolated headless Chromium, screenshots as observations, the GUI tools as actions
(``screen``: what environments and tools share; ``browser``: the isolated browser; ``miniwob_env``: MiniWoB++;
``tasks``: MiniWoB's task names). Only ``screen`` and ``tasks`` load without the ``gui`` extra; the oracle that
solves the offered tasks is a scripted model: ``runtime.miniwob_oracle``."""
