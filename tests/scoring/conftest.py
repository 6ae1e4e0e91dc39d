import sys
from pathlib import Path

# scoring_helpers.py (and the test modules' helpers) are importable by name (pytest runs with --import-mode=importlib).
sys.path.insert(0, str(Path(__file__).parent))
