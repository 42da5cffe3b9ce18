"""GUI environments: pages in an isolated headless Chromium, screenshots as observations, the GUI tools as actions
(``screen``: what environments and tools share; ``browser``: the isolated browser; ``miniwob_env``: MiniWoB++;
``oracle``: a scripted solver that reads the page). Only ``screen`` loads without the ``gui`` extra."""
