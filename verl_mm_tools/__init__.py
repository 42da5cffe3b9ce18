"""verl-mm-tools: multimodal multi-turn tool use for verl, as a plugin."""

from verl_mm_tools.adaptations.import_order import import_first
from verl_mm_tools.adaptations.light_modules import LIGHT_MODULES

__version__ = "0.1.0"

# Every module of ours but the light ones (they import no verl; adaptations/import_graph.py finds them) is run after
# verl has been imported (and has loaded our plugin): see adaptations/import_order.py.
import_first("verl", "verl_mm_tools", LIGHT_MODULES)
