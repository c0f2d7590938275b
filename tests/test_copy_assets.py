"""scripts/copy_assets.py: corpora copied from a shared folder or fetched, checksums checked."""
import srsly

from scripts import copy_assets


def test_copy_assets(tmp_path):
    shared = tmp_path / "shared" / "toy"
    shared.mkdir(parents=True)
    (shared / "a.txt").write_text("hello\n")
    project = tmp_path / "project"
    project.mkdir()
    checksum = copy_assets.md5(shared / "a.txt")
    srsly.write_yaml(project / "project.yml", {"assets": [{"dest": "assets/toy/a.txt", "url": "https://example.invalid/a.txt",
                                                           "checksum": checksum}]})
    args = ["--shared", str(tmp_path / "shared"), "--only", "assets/toy", "--project-dir", str(project)]
    assert copy_assets.main(args) == 0
    assert (project / "assets" / "toy" / "a.txt").read_text() == "hello\n"
    assert copy_assets.fetch(copy_assets.load_assets(project)[0], project, None) == "present"
    (project / "assets" / "toy" / "a.txt").write_text("changed\n")
    (shared / "a.txt").write_text("changed too\n")
    assert copy_assets.main(args) == 1  # checksum mismatch is an error
    assert copy_assets.main(["--only", "assets/none", "--project-dir", str(project)]) == 0
