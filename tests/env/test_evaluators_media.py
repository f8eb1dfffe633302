"""Image, VLC and archive metrics on pictures and files made here."""

from __future__ import annotations

import io
import zipfile

import numpy as np
from PIL import Image, ImageOps

from dart.env.evaluators import FileContent, get_metric
from dart.env.evaluators.metrics_media import ssim


def png(img: Image.Image) -> FileContent:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return FileContent("/home/user/p.png", buf.getvalue())


def picture(seed: int = 0, size=(64, 48)) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = np.kron(rng.integers(0, 255, (size[1] // 8, size[0] // 8)), np.ones((8, 8)))  # blocks: structure
    return Image.fromarray(base.astype(np.uint8)).convert("RGB")


def test_ssim_is_one_for_equal_pictures_and_low_for_unrelated_ones():
    a = picture(0)
    assert ssim(a, a) > 0.999
    assert ssim(a, picture(1)) < 0.5
    assert ssim(a, a.resize((32, 24))) == 0.0


def test_picture_metrics():
    a = picture(0)
    assert get_metric("compare_images")(png(a), png(a)) == 1.0
    assert get_metric("compare_images")(png(picture(1)), png(a)) == 0.0
    assert get_metric("check_structure_sim")(png(a), png(a)) == 1.0
    assert get_metric("check_image_mirror")(png(ImageOps.mirror(a)), png(a)) == 1.0
    assert get_metric("check_image_mirror")(png(a), png(a)) == 0.0
    darker = Image.eval(a, lambda v: int(v * 0.6))
    assert get_metric("check_brightness_decrease_and_structure_sim")(png(darker), png(a)) == 1.0
    assert get_metric("check_brightness_decrease_and_structure_sim")(png(a), png(a)) == 0.0
    assert get_metric("check_image_size")(png(a), {"width": 64, "height": 48}) == 1.0
    assert get_metric("check_image_size")(png(a), {"height": 512}) == 0.0
    assert get_metric("check_structure_sim")(None, png(a)) == 0.0


def test_vlc_settings_and_playing_state():
    rc = FileContent("vlcrc", b"[qt]\n#qt-bgcone=1\nqt-max-volume=200\n")
    assert get_metric("check_qt_max_volume")(rc, {"expected_qt_max_volume": 200}) == 1.0
    assert get_metric("check_qt_bgcone")(rc, {"expected_qt_bgcone": 0}) == 0.0  # default 1 still in force
    status = (b"<root><state>playing</state><information><category name='meta'>"
              b"<info name='filename'>song.mp4</info></category></information></root>")
    playing = get_metric("is_vlc_playing")
    assert playing(FileContent("status.xml", status), {"type": "file_name", "file_name": "song.mp4"}) == 1.0
    assert playing(FileContent("status.xml", status.replace(b"playing", b"paused")),
                   {"type": "file_name", "file_name": "song.mp4"}) == 0.0
    assert playing(None, {"type": "file_name", "file_name": "song.mp4"}) == 0.0


def test_zip_archives_compare_by_members():
    def z(files: dict[str, bytes]) -> FileContent:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as f:
            for name, data in files.items():
                f.writestr(name, data)
        return FileContent("a.zip", buf.getvalue())

    gold = z({"d/a.txt": b"1", "d/b.txt": b"2"})
    assert get_metric("compare_zip_files")(z({"d/a.txt": b"1", "d/b.txt": b"2"}), gold) == 1.0
    assert get_metric("compare_zip_files")(z({"d/a.txt": b"1"}), gold) == 0.0
    assert get_metric("compare_archive")(z({"x/a.txt": b"1", "x/b.txt": b"2"}), z({"a.txt": b"1", "b.txt": b"2"}),
                                         file_path="x") == 1.0


def test_single_task_picture_checks():
    canvas = Image.new("RGB", (100, 80), "white")
    from PIL import ImageDraw

    ImageDraw.Draw(canvas).polygon([(40, 30), (60, 30), (50, 50)], fill="black")
    assert get_metric("check_triangle_position")(png(canvas)) == 1.0
    off = Image.new("RGB", (100, 80), "white")
    ImageDraw.Draw(off).rectangle([5, 5, 20, 20], fill="black")
    assert get_metric("check_triangle_position")(png(off)) == 0.0
    assert get_metric("check_textbox_on_leftside")(png(off)) == 1.0
    assert get_metric("check_textbox_on_leftside")(png(canvas)) == 0.0
    green = canvas.copy()
    px = np.asarray(green).copy()
    px[(px == 255).all(axis=2)] = (0, 200, 0)
    assert get_metric("check_green_background")(png(Image.fromarray(px)), png(canvas)) == 1.0
    assert get_metric("check_green_background")(png(canvas), png(canvas)) == 0.0
    assert get_metric("compare_image_list")([png(canvas), png(off)], [png(canvas), png(off)]) == 1.0
    assert get_metric("compare_image_list")([png(off), png(canvas)], [png(canvas), png(off)]) == 0.0


def test_python_test_suite_runs_on_the_result_files():
    code = FileContent("/home/user/Desktop/snake/food.py", b"def size():\n    return 3\n")
    suite = FileContent("test.py", b"import food\ndef test():\n    return food.size() == 3\n")
    assert get_metric("check_python_file_by_test_suite")([code], suite) == 1.0
    wrong = FileContent("/home/user/Desktop/snake/food.py", b"def size():\n    return 4\n")
    assert get_metric("check_python_file_by_test_suite")([wrong], suite) == 0.0


def test_mp3_tags_are_read_with_mutagen(tmp_path):
    import mutagen.id3

    path = tmp_path / "a.mp3"
    tags = mutagen.id3.ID3()
    tags.add(mutagen.id3.TIT2(encoding=3, text="Missing You"))
    tags.add(mutagen.id3.TPE1(encoding=3, text="Cheng Xiang"))
    tags.save(path)
    f = FileContent(str(path), path.read_bytes())
    rules = {"title": {"method": "eq", "ref": "Missing You"}, "artist": {"method": "eq", "ref": "Cheng Xiang"}}
    assert get_metric("check_mp3_meta")(f, rules) == 1.0
    assert get_metric("check_mp3_meta")(f, {"title": {"method": "eq", "ref": "Other"}}) == 0.0
