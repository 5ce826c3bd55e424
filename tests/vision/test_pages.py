"""Pictures on the pages: the annotation page, the experience browser and a group show the
prompt's pictures as thumbnails that open larger, served to the run's people only, with the
content type found at import and `nosniff`; a picture whose file name and EXIF carry script
is shown inert (Playwright, a real browser)."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from apps.buffer.models import Experience, Task
from apps.buffer.services import experience_write
from apps.runs.models import Run
from tests.factories import add_member, experience_row, image_zip, make_image_taskset, make_run, make_user, picture_png

XSS_NAME = '"><img src=x onerror="document.title=\'pwned\'">.jpg'
EXIF_SCRIPT = "<script>document.title='pwned-exif'</script>"


def _jpeg_with_script_in_exif() -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(picture_png(3)))
    exif = Image.Exif()
    exif[0x010E] = EXIF_SCRIPT  # ImageDescription
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", exif=exif.tobytes(), quality=95)
    return buf.getvalue()


def _run_with_pictures(owner: User, annotator: User, tmp: Path, *, name: str = "vision") -> tuple[Run, list[Experience]]:
    from apps.buffer.importers import taskset_import

    records = [{"prompt": "How many squares are in the image?", "answer": "3", "domain": "vision", "image": XSS_NAME}]
    taskset = taskset_import(name=name, path=image_zip(tmp / f"{name}.zip", records, {XSS_NAME: _jpeg_with_script_in_exif()}),
                             owner=owner)
    run = make_run(owner=owner, taskset=taskset, name=name, feedback={"mode": "blend", "w_auto": 0.5, "w_human": 0.5})
    add_member(run, annotator)
    task = Task.objects.get(taskset=taskset)
    rows = [experience_row(run, key=f"{name}-{i}", group=f"{name}-g", status="pending", reward=None, auto_reward=float(i),
                           task_id=task.pk, prompt_text=task.prompt, response_text=f"<answer>{i + 2}</answer>",
                           metadata={"images": list(task.images)}) for i in range(2)]
    ids = experience_write(experiences=rows).ids
    return run, list(Experience.objects.filter(pk__in=ids).order_by("id"))


@pytest.mark.django_db
def test_the_people_of_the_run_see_its_pictures_and_no_one_else_does(owner: User, annotator: User, tmp_path: Path) -> None:
    run, experiences = _run_with_pictures(owner, annotator, tmp_path)
    digest = experiences[0].metadata["images"][0]
    url = f"/runs/{run.pk}/images/{digest}/"
    client = Client()
    client.force_login(annotator)
    response = client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "image/jpeg" and response["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in response["Content-Security-Policy"]
    # The download name is the digest, never the uploader's name.
    assert "onerror" not in response["Content-Disposition"] and digest[:16] in response["Content-Disposition"]
    assert response.getvalue()[:2] == b"\xff\xd8"

    # The pages that show the experience carry the thumbnail, the name escaped.
    for page in (f"/runs/{run.pk}/experiences/", f"/runs/{run.pk}/groups/{experiences[0].group_id}/",
                 f"/runs/{run.pk}/annotate/queue/?after=0"):
        html = client.get(page).content.decode()
        assert f'src="{url}"' in html, page
        assert 'onerror="document' not in html and "&quot;&gt;&lt;img src=x onerror=" in html, page

    # Another run's picture is not this run's to show, and outsiders see nothing.
    other_owner = make_user("other-owner")
    other = make_run(owner=other_owner, taskset=make_image_taskset(1, owner=other_owner, tmp=tmp_path), name="other")
    foreign = Task.objects.get(taskset=other.taskset).images[0]
    assert client.get(f"/runs/{run.pk}/images/{foreign}/").status_code == 404
    assert client.get(f"/runs/{run.pk}/images/not-a-digest/").status_code == 404
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get(url).status_code == 404


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_annotation_page_shows_the_picture_and_a_script_in_its_name_or_exif_stays_inert(
    page: Any, live_url: str, owner: User, annotator: User, tmp_path: Path,
) -> None:
    from tests.feedback.conftest import login

    run, experiences = _run_with_pictures(owner, annotator, tmp_path, name="xss")
    dialogs: list[str] = []
    def dismissed(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismissed)
    path = f"/runs/{run.pk}/annotate/"
    login(page, live_url, "annotator", next_path=path)
    page.wait_for_url(f"**{path}")
    page.wait_for_selector("#queue .item")
    thumb = page.locator("#queue .item img.thumb").first
    thumb.wait_for()
    # The picture loaded (a decoded 32×32 JPEG), its alt text is the literal file name.
    page.wait_for_function("() => { const i = document.querySelector('#queue .item img.thumb'); return i && i.complete && i.naturalWidth === 32; }")
    assert thumb.get_attribute("alt") == XSS_NAME
    # Click to enlarge: the larger copy shows; click again to close.
    enlarged = page.locator("#queue .item .task-image img.enlarged").first
    assert not enlarged.is_visible()
    thumb.click()
    enlarged.wait_for(state="visible")
    assert enlarged.bounding_box()["width"] > 100
    # Nothing of the name or the EXIF ran or became markup.
    assert page.locator("img[src='x']").count() == 0
    assert "pwned" not in page.title() and dialogs == []
    assert EXIF_SCRIPT not in page.content()
    # Opened on its own, the picture is an image, not a document that could run script.
    src = thumb.get_attribute("src")
    response = page.request.get(live_url + src)
    assert response.headers["content-type"] == "image/jpeg" and response.headers["x-content-type-options"] == "nosniff"
    assert re.search(r"sandbox", response.headers["content-security-policy"])
