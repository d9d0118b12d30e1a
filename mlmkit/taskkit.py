"""The public path of mlmkit.plugin.taskkit, which task plugins import (docs/plugins.md): the same module
under its first name, so a plugin written against it keeps working when files move."""

import sys

from mlmkit.plugin import taskkit

sys.modules[__name__] = taskkit
