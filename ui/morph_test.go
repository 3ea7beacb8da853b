package ui_test

// app.js's keyed morph against real fragments with duplicate data-key
// values (one backend holding one advisory key in two modes).

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/testkit"
)

var dataKeyAttr = regexp.MustCompile(`data-key="([^"]*)"`)

// TestUpdateMorphsAdvisoryRows: one backend holds advisory key 7 shared and exclusive, another
// key 1; key 1 is released; app.js's update of the page from the first fragment to the second,
// run in chromium, leaves exactly the second fragment's text (no stale row, none lost).
func TestUpdateMorphsAdvisoryRows(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base := serve(t, newHandler(t, b.Pool))
	ctx := b.Ctx
	a, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer a.Release()
	two, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer two.Release()
	_, err = a.Exec(ctx, `SELECT pg_advisory_lock(1)`)
	require.NoError(t, err)
	_, err = two.Exec(ctx, `SELECT pg_advisory_lock_shared(7), pg_advisory_lock(7)`) // one backend, two modes
	require.NoError(t, err)

	s := events(t, ctx, base, "advisory", "")
	first := awaitEvent(t, s, 10*time.Second, "both backends", contains(">1<", ">7<"))
	keys := map[string]int{}
	for _, m := range dataKeyAttr.FindAllStringSubmatch(first, -1) {
		keys[m[1]]++
	}
	for k, n := range keys {
		if n > 1 {
			t.Logf("duplicate data-key %q x%d in one list", k, n)
		}
	}
	_, err = a.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	require.NoError(t, err)
	second := awaitEvent(t, s, 10*time.Second, "key 1 gone", func(d string) bool { return !strings.Contains(d, "<td>1</td>") })
	_, _ = two.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock_all()`)

	chromium, err := exec.LookPath("chromium")
	if err != nil && os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium): .ci/run installs it")
	}
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium); CI=true fails instead")
	}
	js, err := os.ReadFile("../internal/liveview/assets/app.js")
	require.NoError(t, err)
	src := string(js)
	i, j := strings.Index(src, "  const key = (n)"), strings.Index(src, `  events.addEventListener("update"`)
	if i < 0 || j < i {
		t.Fatal("app.js no longer has the keyed morph this test runs")
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	page := `<!doctype html><html><body><div id="live"></div><script>` + src[i:j] + `
const live = document.getElementById("live");
live.innerHTML = ` + q(first) + `;
const t = document.createElement("template");
t.innerHTML = ` + q(second) + `;
morphChildren(live, t.content);
const want = document.createElement("div"); want.innerHTML = ` + q(second) + `;
document.title = live.textContent === want.textContent ? "MORPH-OK" : "MORPH-DIFFERS";
document.body.setAttribute("data-got", JSON.stringify([live.textContent, want.textContent]));
</script></body></html>`
	file := filepath.Join(t.TempDir(), "m.html")
	require.NoError(t, os.WriteFile(file, []byte(page), 0o644))
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--dump-dom", "file://"+file).Output()
	require.NoError(t, err)
	dom := string(out)
	if strings.Contains(dom, "<title>MORPH-DIFFERS") {
		t.Errorf("after the update the page's advisory list differs from the fragment sent (duplicate data-key %v): stale rows stay, current ones are lost.\nDOM: %s", keys, dom[strings.Index(dom, "data-got"):][:1500])
	} else {
		require.Contains(t, dom, "<title>MORPH-OK")
	}
}
