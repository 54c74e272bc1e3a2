"""``import dnnkit`` never imports PyTorch; ``import dnnkit.torch`` without PyTorch raises an
ImportError naming the extra."""

import subprocess
import sys


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_import_dnnkit_does_not_import_torch():
    r = _run("import sys, dnnkit; dnnkit.relu; print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_import_dnnkit_torch_without_torch_names_the_extra():
    # sys.modules["torch"] = None makes `import torch` fail as if it were not installed
    r = _run("import sys; sys.modules['torch'] = None\n"
             "try:\n    import dnnkit.torch\nexcept ImportError as e:\n    print('ERR', e)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR dnnkit.torch needs PyTorch")
    assert "dnnkit[torch]" in r.stdout
