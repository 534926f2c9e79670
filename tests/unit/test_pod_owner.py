"""images/runpod/pods.py's pure parts: whose a pod is, and what an interrupted `up` says bills."""

from images.runpod.pods import Made, billed_lines, owner
from images.runpod.volumes import Volume


def test_a_pod_is_its_markers_target_else_its_whole_names_never_a_prefixs():
    assert owner({"name": "kiln-a40-llamacpp-upstream-1"}) == "a40-llamacpp-upstream"
    assert owner({"name": "kiln-a40-llamacpp-12", "env": {}}) == "a40-llamacpp"
    # The marker set at creation wins over a name changed since (RunPod's console can rename).
    assert owner({"name": "my-pod", "env": {"KILN_TARGET": "a40-llamacpp"}}) == "a40-llamacpp"
    for name in ("kiln-a40-llamacpp-", "kiln-a40-llamacpp-0", "kiln-a40-llamacpp-01", "kiln-a40-llamacpp-x",
                 "kiln--1", "my-kiln-a40-1", "kiln-a40-llamacpp-1 "):
        assert owner({"name": name}) is None, name


def test_an_interrupted_up_names_each_pod_the_down_that_removes_them_and_what_else_bills():
    made = Made([("p1", "kiln-t-1"), ("p2", "kiln-t-2")], creating="kiln-t-3",
                volume=Volume("v9", "models", 20, "EU-RO-1", "created"))
    lines = billed_lines(made, "t")
    assert lines[0].endswith("which bill until terminated: kiln-t-1 (p1), kiln-t-2 (p2)")
    assert lines[1] == "  python build.py pods down --pod p1 --pod p2"
    assert "kiln-t-3 was being created" in lines[2] and "pods status --target t" in lines[2]
    assert "pods volumes --delete v9" in lines[3]
    assert billed_lines(Made(), "t") == ["`up` was interrupted before it created a pod: nothing of it bills"]
