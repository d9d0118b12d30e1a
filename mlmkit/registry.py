"""The public path of mlmkit.plugin.registry, which task plugins import (docs/plugins.md): the same module
under its first name, so a plugin written against it keeps working when files move."""

import sys

from mlmkit.plugin import registry

sys.modules[__name__] = registry
