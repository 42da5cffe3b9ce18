"""``verl-mm-tools bench``: side-by-side measurements, one line per figure, then a one-line summary.

Each figure is the median of repeated measurements, printed with its spread: ``name: median 1.02 (min 0.98, max
1.07, n=24)``; a check adds its target, ``, target <= 1.05: met`` (or ``MISSED``); a figure printed without a spread is
counted or derived, not timed. The last line: ``N checks met, M missed: NAME (median VALUE > BOUND), ...``.
Timings are CPU time, not wall time (the machines this runs on are shared: a neighbour's burst delays a sample, it
adds little CPU time to it), and each ratio is the median over interleaved pairs (both sides see the same load).

1. mm_tool against verl's ``tool_agent`` on the same scripted zero-latency server and the same tool, 1/4/8/16 turns
   with one new image per turn, small (56 px) and 448x448 images (processor limits raised so they really yield 256
   image tokens): CPU time (all threads of the process: verl tokenizes in an executor) per trajectory of building
   the agent loop (verl builds one per trajectory) and its ``run()``, and the ratio of the interleaved pairs.
2. Per-turn growth in 16-turn trajectories: the loop's own time for turns 14-16 over turns 2-4, per trajectory, for
   both loops (a loop that re-renders the conversation grows).
3. Each image op on a 512x512 RGB image (crops and boxes half its side; zoom_in upscales to 448 px) divided by PIL
   ``transpose`` of the same image, and each op with the tools' default output cap on 1024x1024 (a downscale), timed
   in interleaved pairs in three fresh processes that load nothing but Pillow and the ops (``bench.ops``). Then each
   op against OpenCV doing the same (same interpolation, expand and fill rules; pixels exact where the libraries can
   agree): Pillow's time over OpenCV's on arrays and behind the op's interface (PIL images in and out), and the share
   of pixels that differ, in fresh processes too (``bench.opencv_ops``; skipped, with a line, without OpenCV).
4. The bytes a finished 16-image mm_tool trajectory holds (verl's ``AgentLoopOutput``: its images' pixel buffers,
   token lists, extra fields; counted, so two runs agree exactly) over the raw bytes of its images (3 per pixel;
   Pillow stores an RGB pixel in 4); then a 16-turn trajectory of 1024 px images (448 px with ``--repeats``) part by
   part, counted once verl's worker has made its sample: the image workspace, the processor outputs
   (``ImageFeatureStore``: each image's compact form) and the sample sent to the trainer, each over the raw bytes
   (targets <= 2, <= 1.25 and <= 1.25), and what the store keeps after (target 0); the trainer's expansion of a
   compact image, CPU ms per image and over the processor pass it replaces in the worker. Without ``--quick`` and
   ``--repeats``: verl's AgentLoopWorker running 1, 8, 32 and 64 such trajectories at once (224 px images), peak
   RSS in fresh processes: the slope per trajectory and per image, the peaks' distance from the line, per image at
   16 turns over 4 (a copy per turn would grow it), and with glibc's mmap threshold fixed (``bench.worker_memory``).
5. (``--step``) verl's real CPU GRPO step (the rotation demo, 8 prompts x 4 rollouts, <= 3 turns, dumps off): trainer
   runs with verl's ``tool_agent`` and with ``mm_tool`` on verl's default v1 trainer (sync), then ``mm_tool`` on the
   classic trainer, then ``mm_tool`` with ``export: per_turn`` (v1): step time after warm-up, the ratios of the
   medians mm_tool / tool_agent, v1 / classic and per_turn / per_trajectory, and (classic only: the v1 trainer does
   not log the slowest trajectory) the share of the step the rollout phase spends outside the slowest trajectory's
   generation.
6. What ``export: per_turn`` costs against ``per_trajectory`` on 4- and 8-turn trajectories (448 px images): the
   tokens the trainer processes per trajectory (every sample's prompt and response; counted) and the trained ones
   (equal: the same generated tokens), and the ratio of the loop's CPU time per trajectory over interleaved pairs
   (target at 8 turns: <= 1.5). A per-turn sample re-encodes the whole history as its prompt, and the loop re-renders
   it before every turn (its text only: each image's processor output is kept from the turn that admitted it). And,
   counted over one 8-turn trajectory of each export, verl's postprocess of its samples included: the images the HF
   image processor processed per image (target <= 1: each image once, ``agent_loop/image_features.py``), and the
   bytes of image inputs the samples carry to the trainer over the trajectory's distinct raw image bytes (target
   <= 1.25; per_turn repeats the history's images in every sample: verl's TransferQueue stores each sample whole).
7. (``--remote``) tools on Ray actor pools: a blocking tool's wall time in process and on 1, 2, 4 actors, and what an
   image costs to cross to an actor and back (``bench.remote``).
8. (``--rollout vllm``) verl's vLLM rollout: with ``--step``, figure 5's mm_tool run again on vLLM, its step time
   over the hf server's and the prefix-cache hit rate of its turns after the first (from verl's server, during
   training); and over a 4-turn trajectory with an image per turn, vLLM's prefix-cache hit rate from turn 2 on and
   the vision-encoder runs per image (``bench.engine``).
9. The sandboxed ``python`` tool: a sandbox's start, and a warm call exchanging a 448 px image (sent in, its flipped
   copy saved and returned) against the same code in this process, wall time in interleaved pairs; the difference's
   target: <= 50 ms (``bench.python_tool``; skipped, with a line on stderr, where bubblewrap cannot run).
10. What the plugin costs each process that imports verl: ``import verl`` in fresh interpreters with the plugin and
    without, interleaved pairs, the CPU platform selected: CPU seconds and their ratio (target <= 1.05), the peak RSS
    the plugin adds (target <= 10 MB) and the modules it adds outside the package (target 0; ``bench.plugin_import``).
11. The GUI environment (MiniWoB++ in isolated headless Chromium), wall time: a browser's launch (wall and CPU
    seconds), reset and step latency, p50 and p95, over 30 ``click-button`` episodes on a reused browser; each
    browser's processes and memory (RSS, PSS, its own anonymous and shared-memory pages) alone, with 8 and with 32
    at once; 32 oracle-solved episodes of the six offered tasks at once on cold browsers (launches included), then
    on the warm pooled ones: trajectories per second and their ratio, the idle CPU of a waiting browser, the share
    solved (target >= 1) (``bench.gui``; skipped, with a line, without miniwob, Chromium, chromedriver or bubblewrap).

The package: ``figures`` (a figure, its line, the summary), ``loop`` (figures 1, 2 and 6), ``memory`` (figure 4),
``steps`` (figures 5 and 8), ``python_tool`` (figure 9), ``gui`` (figure 11), ``run`` (figure 3 and the whole run), and
the fresh processes ``ops`` and ``opencv_ops`` (figure 3), ``worker_memory`` (figure 4), ``engine`` (figure 8) and
``plugin_import`` (figure 10), and ``remote`` (figure 7). The package itself stays light: ``ops`` loads nothing but
Pillow, ``opencv_ops`` Pillow, numpy and OpenCV.
"""
