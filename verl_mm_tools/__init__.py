"""verl-mm-tools: multimodal multi-turn tool use for verl, as a plugin."""

# verl imports our plugin (its ``verl.plugins`` entry point) while verl itself is being imported. Importing verl
# here, before any of our submodules is half-initialised, lets the plugin import them without an import cycle
# whichever module a user imports first.
import verl  # noqa: F401  (imported for its side effect: plugin registration)

__version__ = "0.1.0"
