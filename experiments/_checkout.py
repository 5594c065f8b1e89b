"""Run the experiments with the mocolab of this checkout, installed or not.

`ray job submit --working-dir . -- python experiments/<study>.py` runs the
script in Ray's copy of this folder, on a head node that may have no mocolab
(or an older one) installed. The package beside the script is the code that
was submitted, so it comes first on the path; the study then ships that same
folder to every trial (mocolab/training/shipping.py).
"""

import sys
from pathlib import Path

_PLATFORM = Path(__file__).resolve().parents[1] / "platform"
if (_PLATFORM / "mocolab" / "__init__.py").is_file() and str(_PLATFORM) not in sys.path:
    sys.path.insert(0, str(_PLATFORM))
