"""The dashboard in a real headless browser (Debian's chromium driven by Playwright, nothing
downloaded): sign in, every page, plots that hold the API's numbers, what a reader key may
not see, and live updates. Screenshots go to the test's temporary directory."""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from playwright.sync_api import Browser, Page, Route, sync_playwright

from app.api.ui import CSP
from app.core.ledger import notes
from app.core.ledger.notes import Checkpoint
from app.core.ledger.tiles import ProofPolicy, verify_tlog_proof
from tests.support.cluster import Cluster, free_port

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TRAINING = {"epochs": 3, "batch_size": 64, "learning_rate": 0.1, "seed": 0}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """`lethe serve` (embedded) with a model that has been through two deletions, shared by
    the module's tests (each compares the pages with what the API answers at that moment)."""
    with Cluster(tmp_path_factory.mktemp("dashboard") / "data", None, None) as cluster:
        url = cluster.start_api()
        keys = {"admin": cluster.admin_key}
        for role in ("requester", "auditor", "reader"):
            keys[role] = cluster.new_key(role)
        with cluster.client() as c:
            ds = c.post("/v1/datasets", json={"builtin": "digits"}).json()
            model = c.post(
                "/v1/models",
                json={"name": "digits", "dataset_id": ds["id"], "training": TRAINING},
            ).json()
            wait(c, f"/v1/models/{model['id']}", ("ready",))
            page = c.get(
                f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 3}
            ).json()
        with cluster.client(keys["requester"]) as c:
            for chunk in (page["items"][:1], page["items"][1:3]):
                ids = [s["external_id"] for s in chunk]
                req = c.post("/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": ids})
                wait(c, f"/v1/deletions/{req.json()['id']}", ("done",))
        yield url, keys


def wait(c: httpx.Client, path: str, done: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = c.get(path).json()
        if body["status"] in done:
            return body
        time.sleep(0.2)
    raise AssertionError(f"{path} is {body['status']}")


def sign_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/ui")
    page.fill("#key", key)
    page.click("#signin")
    page.wait_for_selector("table#models")


def same(got: list[tuple[float, float]], want: list[tuple[float, float]]) -> bool:
    """The same points, in order, to float precision."""
    return len(got) == len(want) and all(
        a == pytest.approx(c) and b == pytest.approx(d)
        for (a, b), (c, d) in zip(sorted(got), sorted(want), strict=True)
    )


def points(page: Page, chart: str) -> list[tuple[float, float]]:
    circles = page.locator(f"#{chart} circle.point")
    return [
        (float(c.get_attribute("data-x") or "nan"), float(c.get_attribute("data-y") or "nan"))
        for c in circles.all()
    ]


def test_each_page_shows_what_the_api_returns(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, keys = service
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    sign_in(page, url, keys["admin"])
    models = api.get("/v1/models").json()
    assert page.locator("table#models tr[data-model]").count() == len(models)
    model_id = models[0]["id"]
    preview = api.get("/v1/privacy/preview", params={"model": model_id}).json()
    bar = page.locator(f'tr[data-model="{model_id}"] .bar')
    assert float(bar.get_attribute("data-spent") or "nan") == pytest.approx(
        preview["lineage"]["spent_epsilon"]
    )
    assert page.locator("nav a", has_text="Audit").count() == 1
    page.screenshot(path=str(tmp_path / "models.png"), full_page=True)

    page.click(f'a[href="#/models/{model_id}"]')
    page.wait_for_selector("#plot-accuracy")
    versions = api.get(f"/v1/models/{model_id}/versions").json()
    expected = sorted((v["number"], v["metrics"]["test_accuracy"]) for v in versions)
    assert same(points(page, "plot-accuracy"), expected)
    # Issue 32: accuracy in percent on a padded axis with ticks (at least 4 points tall, so a
    # 0.3-point change cannot fill it), one x tick per version, the value shown on hover.
    ticks = page.locator("#plot-accuracy text.tick.y").all_text_contents()
    assert len(ticks) >= 3 and all(t.endswith(" %") for t in ticks)
    shown = [float(t.removesuffix(" %")) for t in ticks]
    assert max(shown) - min(shown) >= 4 - 1e-9
    assert min(shown) <= 100 * min(a for _, a in expected) <= 100 * max(a for _, a in expected)
    assert 100 * max(a for _, a in expected) <= max(shown) <= 100
    x_ticks = page.locator("#plot-accuracy text.tick.x").all_text_contents()
    assert x_ticks == [f"v{n}" for n, _ in expected]
    page.hover("#plot-accuracy circle.point >> nth=0")
    number, value = expected[0]
    assert (
        page.text_content("#plot-accuracy text.readout") == f"version {number}: {100 * value:.2f} %"
    )
    certificates = api.get("/v1/audit/certificates", params={"model": model_id}).json()["items"]
    assert len(certificates) == 2
    cumulative = sorted({(c["to_version"], c["cumulative_epsilon"]) for c in certificates})
    # the ε chart starts at v1 (nothing spent), like accuracy, under a budget line
    assert same(points(page, "plot-epsilon"), [(1, 0.0), *cumulative])
    budget = page.locator("#plot-epsilon-budget")
    assert float(budget.get_attribute("data-y") or "nan") == preview["lineage"]["budget_epsilon"]
    assert page.locator("#certificates tr[data-certificate]").count() == len(certificates)
    assert certificates[0]["sentence"][:40] in page.inner_text("#certificates")
    # one sample removed is "this sample", not "these 1 samples"
    assert "these 1 samples" not in page.inner_text("#certificates")
    assert any("this sample" in c["sentence"] for c in certificates)
    why = page.inner_text("#lineage-why")  # what "spent" means, with the lineage's own δ
    assert "not the sum" in why and str(preview["lineage"]["budget_delta"]) in why
    assert page.locator("#versions tr[data-version]").count() == len(versions)
    assert page.locator("#preview").count() == 1
    costs = preview["deletion_cost"]["methods"]
    assert page.locator("#deletion-cost tr[data-method]").count() == len(costs)
    assert costs[0]["basis"] in page.inner_text("#deletion-cost")
    assert "noise-free state" in page.inner_text("#storage")
    page.screenshot(path=str(tmp_path / "model.png"), full_page=True)

    page.click('nav a[href="#/deletions"]')
    page.wait_for_selector("#deletions")
    requests = api.get("/v1/deletions").json()["items"]
    assert page.locator("#deletions tr[data-request]").count() == len(requests) == 2
    assert page.locator("#timeline rect.span").count() == 2
    assert page.locator("#timeline text.tick.time").count() >= 2  # a time axis
    assert page.locator("#deletions .status.done").count() >= 2
    dataset_id = models[0]["dataset_id"]
    assert page.locator("#deletions td.dataset").all_inner_texts() == [f"#{dataset_id}"] * 2
    links = page.locator("#deletions td.certificates a[data-certificate]")
    assert sorted(int(a.get_attribute("data-certificate") or 0) for a in links.all()) == sorted(
        c["id"] for c in certificates
    )
    linked = links.first.get_attribute("data-certificate")
    links.first.click()  # a certificate's link opens its model, where its row is
    page.wait_for_selector(f'#certificates tr[data-certificate="{linked}"]')
    page.click('nav a[href="#/deletions"]')
    page.wait_for_selector("#deletions")
    page.screenshot(path=str(tmp_path / "deletions.png"), full_page=True)

    page.click('nav a[href="#/audit"]')
    page.wait_for_selector("#verify")
    assert page.get_attribute("#verify", "data-ok") == "true"
    assert page.get_attribute("#verify", "data-checked") == "2"
    assert page.get_attribute("#tree-head", "data-size") == "2"  # the signed Merkle head
    with page.expect_download() as download:
        page.click("#export")
    exported = Path(download.value.path()).read_text().strip().splitlines()
    assert len(exported) == 2
    page.screenshot(path=str(tmp_path / "audit.png"), full_page=True)
    assert errors == []


def test_a_reader_sees_only_what_it_may(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, keys = service
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{url}/ui")
    page.wait_for_selector("#key")
    assert "null" not in page.inner_text("#main")  # a literal "null" under the form
    icon = httpx.get(f"{url}/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    page.fill("#key", "lethe_not_a_key")
    page.click("#signin")
    page.wait_for_selector("#signin-error")
    assert "401" in page.inner_text("#signin-error")

    sign_in(page, url, keys["reader"])
    assert page.locator("nav a", has_text="Audit").count() == 0
    model_id = page.locator("table#models tr[data-model]").first.get_attribute("data-model")
    page.click(f'a[href="#/models/{model_id}"]')
    page.wait_for_selector("#certificates-hidden")
    assert page.locator("#certificates").count() == 0 and page.locator("#plot-epsilon").count() == 0
    page.screenshot(path=str(tmp_path / "reader-model.png"), full_page=True)
    page.goto(f"{url}/ui#/audit")
    page.wait_for_selector("#audit-hidden")
    page.goto(f"{url}/ui#/deletions")
    page.wait_for_selector("#deletions-hidden")
    assert "403" in page.inner_text("#deletions-hidden")


def test_training_updates_without_a_reload(
    browser: Browser, service: tuple[str, dict[str, str]]
) -> None:
    url, keys = service
    page = browser.new_page()
    sign_in(page, url, keys["admin"])
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    ds = api.get("/v1/models").json()[0]["dataset_id"]
    slow = {**TRAINING, "epochs": 30}
    model = api.post(
        "/v1/models", json={"name": "later", "dataset_id": ds, "training": slow}
    ).json()
    page.evaluate("() => { window.reloaded = false; }")
    page.click('nav a[href="#/deletions"]')
    page.click('nav a[href="#/models"]')  # the list, rendered once by hand ...
    page.wait_for_selector(f'tr[data-model="{model["id"]}"]')
    # ... then refreshed by itself until the training finishes.
    page.wait_for_selector(f'tr[data-model="{model["id"]}"] .status.ready', timeout=120_000)
    assert page.evaluate("() => window.reloaded") is False  # the same document throughout
    # A one-version model's chart: one point at its one tick, no line.
    page.click(f'a[href="#/models/{model["id"]}"]')
    page.wait_for_selector("#plot-accuracy circle.point")
    assert page.locator("#plot-accuracy text.tick.x").all_text_contents() == ["v1"]
    assert page.locator("#plot-accuracy circle.point").count() == 1
    assert page.locator("#plot-accuracy polyline").count() == 0


def test_docs_work_offline_with_an_authorize_button(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Swagger UI comes from the installed package (no CDN: the page would not render here,
    where nothing outside the machine answers), and the Bearer scheme gives it Authorize."""
    url, _ = service
    html = httpx.get(f"{url}/docs").text
    assert "/docs/static/swagger-ui-bundle.js" in html and "cdn" not in html.lower()
    schemes = httpx.get(f"{url}/openapi.json").json()["components"]["securitySchemes"]
    assert schemes["APIKey"] == {**schemes["APIKey"], "type": "http", "scheme": "bearer"}
    for path in ("/docs", "/redoc"):  # a policy, and no frame may hold them
        policy = httpx.get(f"{url}{path}").headers["content-security-policy"]
        assert (
            "frame-ancestors 'none'" in policy
            and "'unsafe-inline'" not in policy.split("style-src")[0]
        )
    page = browser.new_page()
    requested: list[str] = []
    refused: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.on("console", lambda m: refused.append(m.text) if "Security Policy" in m.text else None)
    page.goto(f"{url}/docs")
    page.wait_for_selector(".swagger-ui button.authorize", timeout=30_000)
    assert page.locator(".opblock").count() > 20  # every operation is listed
    assert all(r.startswith(url) for r in requested), requested
    page.screenshot(path=str(tmp_path / "docs.png"))
    page.goto(f"{url}/redoc")  # ReDoc renders under its policy too
    page.wait_for_selector("[data-section-id]", timeout=30_000)
    # what the policy refused is the bundle's logo on a CDN, never a script or style of ours
    assert not [m for m in refused if "script" in m or "style" in m], refused


def test_an_auditor_runs_a_privacy_audit_from_the_model_page(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """the model page runs an audit with the signed-in key and shows its figures
    beside the certificates; a reader's click shows the API's refusal."""
    url, keys = service
    reader = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(reader, url, keys["reader"])
    model_id = reader.locator("table#models tr[data-model]").first.get_attribute("data-model")
    reader.click(f'a[href="#/models/{model_id}"]')
    reader.click("#run-audit")
    reader.wait_for_selector("#audit-message.error")
    assert "403 forbidden" in reader.inner_text("#audit-message")

    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    sign_in(page, url, keys["auditor"])
    page.click(f'a[href="#/models/{model_id}"]')
    page.wait_for_selector("#no-audits")
    page.select_option("#audit-score", "weights")  # issue 56's white-box score
    page.click("#run-audit")
    # an exact retrain of the audit's shadow usually equals its reference bit for bit (every
    # weights score 0, AUC 0.5), but not always: a run of the suite under load found
    # `violated` once (stop 65's note). The page must show whatever the audit found.
    page.wait_for_selector(
        "table#audits td.verdict:is(.consistent, .violated, .inconclusive)", timeout=180_000
    )
    row = page.locator("table#audits tr[data-audit]").first
    audit_id = row.get_attribute("data-audit")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['auditor']}"}) as c:
        audit = c.get(f"/v1/audits/{audit_id}").json()
    cells = [c.inner_text() for c in row.locator("td").all()]
    result = audit["result"]
    assert cells[2] == audit["verdict"] and audit["result"]["guarantee"] == "exact"
    assert audit["options"]["score"] == "weights" and audit["options"]["kind"] == "random"
    assert audit["verdict"] in ("consistent", "inconclusive", "violated")
    assert 0.0 <= result["auc"] <= 1.0
    assert cells[3] == result["audited"] == "retrain"
    assert float(cells[5]) == pytest.approx(result["joint"]["epsilon"], abs=5e-3)
    assert float(cells[6]) == pytest.approx(result["joint"]["ceiling"], rel=5e-3)
    assert float(cells[9]) == pytest.approx(result["one_run"]["epsilon"], abs=5e-3)
    assert cells[11] == f"#{audit['certificate_id']}"
    page.screenshot(path=str(tmp_path / "audit-on-model-page.png"), full_page=True)


# ---- issue 32: acting from the dashboard, verifying in the browser ---------------------------


def requester_receipt(url: str, keys: dict[str, str]) -> tuple[str, dict]:
    """The requester's newest finished request and its first certificate's `.tlog-proof`."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['requester']}"}) as c:
        done = [r for r in c.get("/v1/deletions").json()["items"] if r["certificate_ids"]]
        request = done[0]
        proof = c.get(f"/v1/deletions/{request['id']}/tlog-proofs/{request['certificate_ids'][0]}")
        assert proof.status_code == 200, proof.text
        return proof.text, request


def verdict(page: Page, url: str, path: Path) -> tuple[str, str]:
    page.goto(f"{url}/verify")
    page.set_input_files("#receipt", str(path))
    page.wait_for_selector("#result [data-verdict]")
    card = page.locator("#result [data-verdict]")
    return card.get_attribute("data-verdict") or "", page.inner_text("#proven")


def test_a_receipt_verifies_in_the_browser_with_no_key(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """/verify checks a `.tlog-proof` with WebCrypto against the pinned log key and today's
    checkpoint; a changed certificate, a changed checkpoint and a stranger's signature are
    refused, each saying why."""
    url, keys = service
    text, _ = requester_receipt(url, keys)
    served = httpx.get(f"{url}/verify")
    assert served.status_code == 200 and served.headers["content-security-policy"] == CSP
    vkey = httpx.get(f"{url}/log/vkey").text.strip()
    assert f'content="{vkey}"' in served.text  # the key the page pins is the log's
    head, _, note = text.partition("\n\n")
    lines = head.split("\n")
    index = int(lines[2].removeprefix("index "))
    # one more certificate after the receipt's checkpoint: the page must show, from the public
    # tiles, that the larger latest tree extends the receipt's
    admin = {"Authorization": f"Bearer {keys['admin']}"}
    with httpx.Client(base_url=url, headers=admin, timeout=60) as c:  # a long poll of 30 s
        dataset = c.get("/v1/models").json()[0]["dataset_id"]
        more = c.get(
            f"/v1/datasets/{dataset}/samples", params={"split": "train", "offset": 20, "limit": 1}
        ).json()["items"][0]["external_id"]
        filed = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": [more]})
        found: dict = {"status": "queued"}
        for _ in range(10):  # long polls until it ends (one of 30 s ran out on a busy machine)
            found = c.get(f"/v1/deletions/{filed.json()['id']}", params={"wait": 30}).json()
            if found["status"] in ("done", "failed"):
                break
        assert found["status"] == "done"
    latest = Checkpoint.parse(notes.split(httpx.get(f"{url}/log/checkpoint").text)[0])
    assert latest.size > Checkpoint.parse(notes.split(note)[0]).size

    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    good = tmp_path / "receipt.tlog-proof"
    good.write_text(text)
    kind, sentence = verdict(page, url, good)
    assert kind == "verified", sentence
    assert f"is entry {index} of the public log" in sentence
    assert f"latest checkpoint ({latest.size} entries)" in sentence
    assert "Not proven" in page.inner_text("#limits")
    page.screenshot(path=str(tmp_path / "verify-ok.png"), full_page=True)
    assert all(r.startswith(url) for r in requested), requested  # nothing leaves the origin

    body = json.loads(base64.b64decode(lines[1].removeprefix("extra ")))
    body["epsilon"] = float(body.get("epsilon") or 0) + 1.0  # a certificate made to say more
    forged = (
        "\n".join(
            [lines[0], "extra " + base64.b64encode(json.dumps(body).encode()).decode(), *lines[2:]]
        )
        + "\n\n"
        + note
    )
    (tmp_path / "forged.tlog-proof").write_text(forged)
    kind, sentence = verdict(page, url, tmp_path / "forged.tlog-proof")
    assert kind == "refused" and "inclusion proof does not lead" in sentence, sentence
    advice = page.inner_text("#next")  # what to do next, and where it leads
    assert "download it again" in advice
    route = re.search(r"GET (/v1/deletions/\{request\}/tlog-proofs/\{certificate\})", advice)
    assert route is not None, advice
    again = route.group(1).format(request=found["id"], certificate=found["certificate_ids"][0])
    assert httpx.get(f"{url}{again}", headers=admin).status_code == 200
    page.fill("#pasted", text)  # the receipt pasted instead of chosen as a file
    page.click("#check-pasted")
    page.wait_for_selector("#result [data-verdict='verified']")
    assert f"is entry {index} of the public log" in page.inner_text("#proven")
    page.fill("#pasted", forged)
    page.click("#check-pasted")
    page.wait_for_selector("#result [data-verdict='refused']")

    checkpoint_text, signatures = notes.split(note)
    cp = Checkpoint.parse(checkpoint_text)
    moved = Checkpoint(cp.origin, cp.size, bytes(32)).text  # another root under the same line
    line = next(f"{notes.DASH} {name} {base64.b64encode(raw).decode()}\n"
                for name, raw in signatures if name == cp.origin)  # fmt: skip
    (tmp_path / "moved.tlog-proof").write_text(head + "\n\n" + moved + "\n" + line)
    kind, sentence = verdict(page, url, tmp_path / "moved.tlog-proof")
    assert kind == "refused" and "signature on the checkpoint does not verify" in sentence

    stranger = Ed25519PrivateKey.generate()  # the same origin, someone else's key
    resigned = checkpoint_text + "\n" + notes.sign(checkpoint_text, cp.origin, stranger)
    (tmp_path / "stranger.tlog-proof").write_text(head + "\n\n" + resigned)
    kind, sentence = verdict(page, url, tmp_path / "stranger.tlog-proof")
    assert kind == "refused" and "not signed by this log's key" in sentence, sentence
    page.screenshot(path=str(tmp_path / "verify-refused.png"), full_page=True)
    assert not errors, errors


def test_a_requester_files_a_deletion_and_downloads_its_receipt(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """the deletions page files a request with the signed-in key (after a
    confirmation, with an idempotency key), follows it to its certificate, and hands over the
    receipt, which verifies offline; the API's refusal is shown as it comes; a reader gets no
    form."""
    url, keys = service
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    dataset = admin.get("/v1/models").json()[0]["dataset_id"]
    sample = admin.get(
        f"/v1/datasets/{dataset}/samples", params={"split": "train", "offset": 10, "limit": 1}
    ).json()["items"][0]["external_id"]

    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    sign_in(page, url, keys["requester"])
    page.click('nav a[href="#/deletions"]')
    page.wait_for_selector("#new-deletion")
    dialogs: list[str] = []

    def answer(dialog) -> None:  # type: ignore[no-untyped-def]
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.fill("#del-dataset", str(dataset))
    page.fill("#del-samples", "no-such-sample")
    page.click("#del-submit")
    page.wait_for_selector("#del-error:not(:empty)")
    assert page.inner_text("#del-error").startswith("404 ")  # the API's own message

    page.fill("#del-dataset", str(dataset))
    page.fill("#del-samples", sample)
    page.click("#del-submit")
    page.wait_for_selector("#del-done:not(:empty)")
    assert dialogs and "cannot be undone" in dialogs[-1]
    request_id = int(page.inner_text("#del-done").split("#")[1].split(" ")[0])
    requester = {"Authorization": f"Bearer {keys['requester']}"}
    with httpx.Client(base_url=url, headers=requester, timeout=60) as c:
        filed = {"status": "queued"}
        for _ in range(10):  # long polls of 30 s until it ends (one ran out on a busy machine)
            filed = c.get(f"/v1/deletions/{request_id}", params={"wait": 30}).json()
            if filed["status"] in ("done", "failed"):
                break
    assert filed["status"] == "done"
    row = f'tr[data-request="{request_id}"]'
    page.wait_for_selector(f"{row} .status.done", timeout=60_000)  # it followed, no reload
    page.wait_for_selector(f"{row} button.receipt")
    with page.expect_download() as download:
        page.click(f"{row} button.receipt")
    saved = tmp_path / "download.tlog-proof"
    download.value.save_as(saved)
    policy = ProofPolicy.parse(f"log {httpx.get(f'{url}/log/vkey').text.strip()}\n")
    proven = verify_tlog_proof(saved.read_text(), policy)
    assert json.loads(proven.entry)["request_id"] == request_id
    page.screenshot(path=str(tmp_path / "deletions-filed.png"), full_page=True)

    reader = browser.new_page()
    sign_in(reader, url, keys["auditor"])
    reader.click('nav a[href="#/deletions"]')
    reader.wait_for_selector("table#deletions")
    assert reader.locator("#new-deletion").count() == 0  # an auditor reads, it does not file


def test_an_admin_registers_a_dataset_and_creates_a_model(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """the models page registers an uploaded CSV (multipart, with the signed-in key)
    and creates a model on it, which then trains in the list; the API's refusal of a bad file
    is shown as it comes; a requester's models page has neither form."""
    url, keys = service
    rows = ["label,f0,f1,f2"] + [f"{i % 2},{i % 7},{(i * 3) % 5},{i % 2 + 0.5}" for i in range(60)]
    good = tmp_path / "people.csv"
    good.write_text("\n".join(rows) + "\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("no label column here\n1,2\n")

    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    sign_in(page, url, keys["admin"])
    page.wait_for_selector("#new-dataset")
    page.set_input_files("#ds-file", str(bad))
    page.click("#ds-submit")
    page.wait_for_selector("#ds-error:not(:empty)")
    assert page.inner_text("#ds-error")[:3] in {"400", "422"}  # the API's answer, as it came

    page.set_input_files("#ds-file", str(good))
    page.click("#ds-submit")
    page.wait_for_selector("#ds-done:not(:empty)")
    dataset_id = int(page.inner_text("#ds-done").split("#")[1].split(" ")[0])
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    registered = admin.get(f"/v1/datasets/{dataset_id}").json()
    assert registered["n_samples"] == 60 and registered["source"] == "csv"
    assert page.input_value("#m-dataset") == str(dataset_id)  # carried to the model form
    # Issue 55: the datasets table lists it (GET /v1/datasets), and its button picks it
    row = page.locator(f'table#datasets tr[data-dataset="{dataset_id}"]')
    row.wait_for()
    assert "ready" in row.inner_text() and "60" in row.inner_text()
    assert page.locator(f'#dataset-choices option[value="{dataset_id}"]').count() == 1
    page.fill("#m-dataset", "")
    row.locator("button.use-dataset").click()
    assert page.input_value("#m-dataset") == str(dataset_id)

    # The method table for this dataset (GET /v1/privacy/methods): what the API plans and
    # refuses, row by row; choosing a row chooses the method.
    page.wait_for_selector("#method-choices")
    table = admin.get("/v1/privacy/methods", params={"dataset": dataset_id, "epsilon": 1}).json()
    shown = page.locator("#method-choices tr[data-method]")
    assert shown.count() == len(table["methods"])
    for row in table["methods"]:
        cells = page.locator(f'#method-choices tr[data-method="{row["method"]}"] td')
        assert cells.nth(1).inner_text() == row["guarantee"]
        if row["available"]:
            sigma = cells.nth(2).inner_text()
            assert (
                sigma == "—"
                if row["sigma"] is None
                else float(sigma) == pytest.approx(row["sigma"], rel=1e-3)
            )
        else:  # the API's refusal, as it came, less pydantic's prefix
            assert cells.nth(6).inner_text().startswith(row["refusal"].replace("Value error, ", ""))
    options = page.locator("#m-method option").all_inner_texts()
    assert options == ["auto: Lethe chooses"] + [
        r["method"] for r in table["methods"] if r["available"]
    ]
    assert page.input_value("#m-method") == "auto"  # the form's default
    refused = [r for r in table["methods"] if not r["available"]]
    for row in refused:  # the API's refusal without pydantic's "Value error, " prefix
        text = page.locator(f'#method-choices tr[data-method="{row["method"]}"] td').nth(6)
        assert "Value error" not in text.inner_text()
    page.click('#method-choices tr[data-method="sharded_retrain"] button.choose')
    assert page.input_value("#m-method") == "sharded_retrain"
    assert "chosen" in (
        page.get_attribute('#method-choices tr[data-method="sharded_retrain"]', "class") or ""
    )
    page.screenshot(path=str(tmp_path / "models-method-table.png"), full_page=True)
    page.fill("#m-name", "from-the-dashboard")
    # the architecture and the method's options are the form's too
    page.select_option("#m-architecture", "mlp")
    page.fill("#m-widths", "32, 16")
    page.fill("#m-options", "not json")
    page.click("#m-submit")
    page.wait_for_selector("#m-error:has-text('JSON object')")
    page.fill("#m-options", '{"shards": 2, "slices": 1}')
    page.click("#m-submit")
    page.wait_for_selector("#m-done:not(:empty)")
    model_id = int(page.inner_text("#m-done").split("#")[1].split(" ")[0])
    created = admin.get(f"/v1/models/{model_id}").json()
    assert created["name"] == "from-the-dashboard" and created["dataset_id"] == dataset_id
    assert created["method"]["name"] == "sharded_retrain"  # the row chosen in the table
    assert created["method"]["shards"] == 2 and created["method"]["slices"] == 1
    assert created["architecture"]["type"] == "mlp"
    assert created["architecture"]["hidden"] == [32, 16]
    page.wait_for_selector(f'tr[data-model="{model_id}"] .status.ready', timeout=120_000)
    page.screenshot(path=str(tmp_path / "models-created.png"), full_page=True)

    requester = browser.new_page()
    sign_in(requester, url, keys["requester"])
    assert requester.locator("#new-dataset").count() == 0
    assert requester.locator("#new-model").count() == 0


def test_an_admin_registers_a_parquet_file_with_a_column_mapping(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """the register form takes a Parquet file and its column mapping (label, id,
    subject; the features a list column), and the datasets table lists what it made."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    X = np.random.default_rng(1).standard_normal((40, 5)).astype(np.float32)
    table = pa.table(
        {
            "key": [f"row-{i}" for i in range(40)],
            "who": [f"person-{i // 4}" for i in range(40)],
            "target": (X[:, 0] > 0).astype(np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), 5),
        }
    )
    path = tmp_path / "people.parquet"
    pq.write_table(table, path, row_group_size=16)
    url, keys = service
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    sign_in(page, url, keys["admin"])
    page.wait_for_selector("#new-dataset")
    page.set_input_files("#ds-file", str(path))
    page.fill("#ds-label-column", "target")
    page.fill("#ds-id-column", "key")
    page.fill("#ds-subject-column", "who")
    page.click("#ds-submit")
    page.wait_for_selector("#ds-done:not(:empty)")
    dataset_id = int(page.inner_text("#ds-done").split("#")[1].split(" ")[0])
    row = page.locator(f'table#datasets tr[data-dataset="{dataset_id}"]')
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[2] == "parquet" and cells[3] == "40" and cells[4] == "5" and cells[5] == "ready"
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    who = admin.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": "person-2"}).json()
    assert {s["external_id"] for s in who["items"]} == {f"row-{i}" for i in range(8, 12)}
    # Appends: "append rows" on the dataset's row, a new file, the same mapping
    more = pa.table(
        {
            "key": [f"row-{i}" for i in range(40, 60)],
            "who": [f"person-{i // 4}" for i in range(40, 60)],
            "target": (X[:20, 1] > 0).astype(np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(X[:20].reshape(-1)), 5),
        }
    )
    pq.write_table(more, tmp_path / "more.parquet")
    spec = {"name": "learner", "dataset_id": dataset_id, "training": TRAINING}
    learner = admin.post("/v1/models", json=spec).json()["id"]
    wait(admin, f"/v1/models/{learner}", ("ready",))
    row.locator("button.append-rows").click()
    assert page.input_value("#ds-append-to") == str(dataset_id)
    page.set_input_files("#ds-file", str(tmp_path / "more.parquet"))
    page.fill("#ds-label-column", "target")
    page.fill("#ds-id-column", "key")
    page.fill("#ds-subject-column", "who")
    page.click("#ds-submit")
    page.wait_for_selector("#ds-done:has-text('Appended')")
    assert f"Appended 20 rows to dataset #{dataset_id}" in page.inner_text("#ds-done")
    # the form follows the models' learning (a long poll the worker's commit answers)
    page.wait_for_selector(f"#ds-done:has-text('model #{learner} learned')")
    learned = admin.get(f"/v1/models/{learner}/versions").json()[-1]
    assert learned["kind"] == "learned"
    assert f"learned {learned['metrics']['n_added']} rows" in page.inner_text("#ds-done")
    cell = f'table#datasets tr[data-dataset="{dataset_id}"] td:nth-child(4):text-is("60")'
    page.wait_for_selector(cell)  # the table re-rendered with the dataset's new count
    page.screenshot(path=str(tmp_path / "datasets-appended.png"), full_page=True)


def test_sigma_is_shown_against_the_released_weights_norm(
    browser: Browser, service: tuple[str, dict[str, str]]
) -> None:
    """σ alone says little; the model page puts the noise vector's expected norm
    σ√d beside the released weights' norm (both public metrics of the current version)."""
    url, keys = service
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"}) as c:
        dataset = c.get("/v1/models").json()[0]["dataset_id"]
        created = c.post(
            "/v1/models",
            json={"name": "noisy", "dataset_id": dataset, "architecture": {"type": "logreg"},
                  "method": {"name": "convex_head", "lam": 0.01, "R": 10.0}},
        )  # fmt: skip
        assert created.status_code == 202, created.text
        model_id = created.json()["id"]
        wait(c, f"/v1/models/{model_id}", ("ready",))
        sample = c.get(
            f"/v1/datasets/{dataset}/samples", params={"split": "train", "offset": 40, "limit": 1}
        ).json()["items"][0]["external_id"]
        filed = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": [sample]})
        wait(c, f"/v1/deletions/{filed.json()['id']}", ("done",))
        metrics = c.get(f"/v1/models/{model_id}").json()["current_version"]["metrics"]
    assert metrics["weights_norm"] > 0 and metrics["expected_noise_norm"] > 0
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    sign_in(page, url, keys["reader"])
    page.goto(f"{url}/ui#/models/{model_id}")
    page.wait_for_selector("#sigma-context")
    text = page.inner_text("#sigma-context")
    shown = re.search(r"([0-9.e+-]+) % of the released weights' norm", text)
    assert shown, text
    share = 100 * metrics["expected_noise_norm"] / metrics["weights_norm"]
    assert float(shown.group(1)) == pytest.approx(share, rel=0.05)


def test_a_slow_page_never_draws_over_the_page_the_user_moved_to(
    browser: Browser, service: tuple[str, dict[str, str]]
) -> None:
    """A render still awaiting the API when the user follows another link draws nothing: on a
    loaded machine the models page's answer came after the deletions page's, and drew the models
    page over the deletions form (CI, stop 64)."""
    url, keys = service
    page = browser.new_page()
    sign_in(page, url, keys["requester"])
    held: list[Route] = []
    page.route("**/v1/models", lambda route: held.append(route))
    page.click('nav a[href="#/deletions"]')
    page.wait_for_selector("#new-deletion")
    with page.expect_request("**/v1/models"):  # the models page's render, held on the API
        page.click('nav a[href="#/models"]')
    page.click('nav a[href="#/deletions"]')
    page.wait_for_selector("#new-deletion")
    assert held, "the models page's request was not held"
    for route in held:
        route.continue_()
    page.unroute("**/v1/models")
    page.wait_for_selector('#main[data-discarded="1"]', state="attached")
    assert page.is_visible("#new-deletion")
    assert not page.is_visible("table#models")


def test_an_admin_adds_a_webhook_follows_its_deliveries_replays_rotates_and_deletes(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Issue 58 on the dashboard: the admin adds an endpoint with an event filter (its secret
    shown once), a real receiver verifies what the deletion then sends, the endpoint's page
    shows the delivery as the API does, a replay arrives again with the same webhook-id, a
    rotation shows a new secret while the old one still signs, and a deletion removes it."""
    from tests.integration.test_webhooks import Receiver

    url, keys = service
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("dialog", lambda dialog: dialog.accept())
    sign_in(page, url, keys["admin"])
    page.click('nav a[href="#/webhooks"]')
    page.wait_for_selector("#new-webhook")
    port = free_port()
    page.fill("#hook-url", f"http://127.0.0.1:{port}/lethe")
    page.check('#hook-events input[value="deletion.completed"]')
    page.fill("#hook-description", "privacy desk")
    page.click("#hook-submit")
    page.wait_for_selector("#hook-error:not(:empty)")  # loopback: refused unless allowed
    assert page.inner_text("#hook-error").startswith("422 ")
    assert admin.get("/v1/webhooks").json() == []
    page.check("#hook-private")
    page.click("#hook-submit")
    page.wait_for_selector("#webhook-secret")
    secret = page.inner_text("#webhook-secret")
    hook_id = int(page.get_attribute("#webhook-secret", "data-webhook") or "0")
    (hook,) = admin.get("/v1/webhooks").json()
    assert hook["id"] == hook_id and secret.startswith("whsec_") and hook.get("secret") is None
    assert hook["events"] == ["deletion.completed"] and hook["description"] == "privacy desk"
    page.wait_for_selector(f'#webhooks tr[data-webhook="{hook_id}"]')

    receiver = Receiver(port, tmp_path / "received.jsonl", [secret])
    receiver.start()
    try:
        dataset = admin.get("/v1/models").json()[0]["dataset_id"]
        sample = admin.get(  # offsets 10, 20 and 40 are other tests' of this module
            f"/v1/datasets/{dataset}/samples", params={"split": "train", "offset": 30, "limit": 1}
        ).json()["items"][0]["external_id"]
        requester = {"Authorization": f"Bearer {keys['requester']}"}
        with httpx.Client(base_url=url, headers=requester, timeout=60) as c:
            filed = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": [sample]})
            assert filed.status_code == 202, filed.text
            wait(c, f"/v1/deletions/{filed.json()['id']}", ("done",))
        (event,) = receiver.wait_for("the deletion's event", lambda e: True)
        assert event["type"] == "dev.lethe.deletion.completed"  # CloudEvents reverse-DNS

        page.click(f'#webhooks tr[data-webhook="{hook_id}"] a')
        row = '#deliveries tr[data-status="delivered"]'
        page.wait_for_selector(row, timeout=60_000)  # live while a delivery is pending
        deliveries = admin.get(f"/v1/webhooks/{hook_id}/deliveries").json()
        assert deliveries["total"] == 1 == page.locator("#deliveries tr[data-delivery]").count()
        (delivery,) = deliveries["items"]
        assert page.inner_text(f'tr[data-delivery="{delivery["id"]}"] code') == event["id"]
        page.screenshot(path=str(tmp_path / "webhook-deliveries.png"), full_page=True)

        page.click(f'tr[data-delivery="{delivery["id"]}"] button.replay')
        deadline = time.monotonic() + 60
        while len(same_id := [e for e in receiver.seen() if e["id"] == event["id"]]) < 2:
            assert time.monotonic() < deadline, "the replay did not arrive"
            time.sleep(0.1)
        assert all(e["valid"] for e in same_id) and same_id[0]["body"] == same_id[1]["body"]
        page.wait_for_selector(
            f'tr[data-delivery="{delivery["id"]}"][data-status="delivered"]'
            f':not([data-attempts="{delivery["attempts"]}"])',
            timeout=60_000,
        )
    finally:
        receiver.stop()

    page.click('nav a[href="#/webhooks"]')
    page.click(f'#webhooks tr[data-webhook="{hook_id}"] button.rotate')
    page.wait_for_function(
        "old => { const s = document.querySelector('#webhook-secret'); "
        "return s && s.textContent !== old; }",
        arg=secret,
    )
    rotated = admin.get(f"/v1/webhooks/{hook_id}").json()
    assert page.inner_text("#webhook-secret").startswith("whsec_")
    assert rotated["previous_secret_until"] is not None
    page.wait_for_selector(f'#webhooks tr[data-webhook="{hook_id}"] >> text=both sign until')
    page.screenshot(path=str(tmp_path / "webhooks.png"), full_page=True)
    page.click(f'#webhooks tr[data-webhook="{hook_id}"] button.delete')
    page.wait_for_selector(f'#webhooks tr[data-webhook="{hook_id}"]', state="detached")
    assert admin.get("/v1/webhooks").json() == []
    assert admin.get(f"/v1/webhooks/{hook_id}").status_code == 404


def test_a_training_model_s_page_shows_its_progress_and_the_audit_page_finds_certificates(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """The model page of a model in training shows "epoch k of E", its loss and the time left,
    live, until it is ready; the Audit page lists the certificates newest first, says what
    each answers (a request, never "request 0") and filters them as one types; times are
    24-hour."""
    url, keys = service
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    dataset = admin.get("/v1/models").json()[0]["dataset_id"]
    slow = {"epochs": 400, "batch_size": 16, "learning_rate": 0.05, "seed": 0}
    spec = {"name": "slow", "dataset_id": dataset, "training": slow,
            "architecture": {"type": "mlp", "hidden": [64]}}  # fmt: skip
    model = admin.post("/v1/models", json=spec).json()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, url, keys["admin"])
    page.goto(f"{url}/ui#/models/{model['id']}")
    page.wait_for_selector("#training-epoch:has-text('left')", timeout=120_000)
    said = page.inner_text("#training-epoch")
    assert re.search(r"epoch \d+ of 400 · loss [\d.]+ · about .+ left", said), said
    assert page.get_attribute("#training-bar", "max") == "400"
    page.screenshot(path=str(tmp_path / "model-training.png"), full_page=True)
    page.wait_for_selector("h1 .status.ready", timeout=300_000)  # live, to the end
    assert page.locator("#training").count() == 0

    page.goto(f"{url}/ui#/audit")
    page.wait_for_selector("#audit-certificates tr[data-certificate]")
    listed = admin.get("/v1/audit/certificates", params={"limit": 1000}).json()["items"]
    rows = page.locator("#audit-certificates tr[data-certificate]")
    assert rows.count() == len(listed)
    assert rows.first.get_attribute("data-certificate") == str(listed[-1]["id"])  # newest first
    answered = page.locator("#audit-certificates td:nth-child(3)").all_inner_texts()
    assert "request 0" not in answered and any(a.startswith("request ") for a in answered)
    page.fill("#certificate-search", f"#{listed[-1]['id']}")  # the highest id: no prefix
    assert rows.count() == 1 and "1 of" in page.inner_text("#certificate-count")
    page.fill("#certificate-search", "")
    assert rows.count() == len(listed)
    created = page.locator("#audit-certificates td:nth-child(8)").first.inner_text()
    assert re.fullmatch(r"\d{2}:\d{2}:\d{2}", created), created  # 24-hour, as the timeline
    page.screenshot(path=str(tmp_path / "audit-certificates.png"), full_page=True)
    assert errors == []


def test_an_append_with_an_erased_row_says_which_choice_of_the_form_takes_it(
    browser: Browser, service: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """Appending rows of a person erased earlier: the 409 `erased_rows_present` told a
    dashboard user to "send on_erased=skip"; the form names its own choice, and with it the
    rest is appended."""
    import numpy as np

    url, keys = service
    admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {keys['admin']}"})
    rng = np.random.default_rng(1)

    def people(path: Path, ids: list[str], who: list[str]) -> Path:
        np.savez(path, X=rng.normal(size=(len(ids), 4)).astype(np.float32),
                 y=np.arange(len(ids)) % 2, ids=np.array(ids), subjects=np.array(who))  # fmt: skip
        return path

    base = people(tmp_path / "base.npz", [f"b{i}" for i in range(12)], ["ann", "bob"] * 6)
    dataset = admin.post("/v1/datasets", files={"file": ("base.npz", base.read_bytes())})
    assert dataset.status_code == 201, dataset.text
    dataset_id = dataset.json()["id"]
    erased = admin.post(
        "/v1/deletions",
        json={"dataset_id": dataset_id, "subject_ids": ["ann"]},
        headers={"Prefer": "wait=60"},
    )
    assert erased.json()["status"] == "done", erased.text
    more = people(tmp_path / "more.npz", ["n1", "n2", "n3"], ["ann", "bob", "cy"])
    page = browser.new_page(viewport={"width": 1280, "height": 1200})
    sign_in(page, url, keys["admin"])
    page.wait_for_selector("#new-dataset")
    page.fill("#ds-append-to", str(dataset_id))
    page.set_input_files("#ds-file", str(more))
    page.click("#ds-submit")
    page.wait_for_selector("#ds-error:not(:empty)")
    said = page.inner_text("#ds-error")
    assert 'choose "leave those rows out"' in said and "on_erased" not in said, said
    page.select_option("#ds-on-erased", "skip")
    page.set_input_files("#ds-file", str(more))
    page.click("#ds-submit")
    page.wait_for_selector("#ds-done:not(:empty)")
    assert "1 rows of erased people left out" in page.inner_text("#ds-done")
