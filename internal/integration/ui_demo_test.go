package integration

import (
	"context"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/pgtest"
)

// TestUIPaymentsDemo: `fencelock ui` against the payments demo's database shows the workers'
// leases live while the demo runs, and afterwards, for a payment whose paused worker's late
// write the fence refused, the timeline of that lease: the paused worker's grant with its
// token and the grant of another worker. With FENCELOCK_SCREENSHOTS=dir it saves both pages
// (demo-leases.png, demo-name.png: the README's pictures).
//
// Hang bounds, not the machine's speed: the demo runs for uiDemoRun at most, from its start
// (after the builds), and the whole test, builds and browser included, for uiDemoHang (the
// two builds, the browser and the demo shared setup's two minutes, too few beside a second
// suite on a loaded machine).
func TestUIPaymentsDemo(t *testing.T) {
	t.Parallel()
	chromium := pgtest.LookProgram(t, "chromium", "apt-get install chromium")
	b := setupWithin(t, uiDemoHang)
	base := startUI(t, b)
	page := newBrowser(t, b.Ctx, chromium)
	page.open(base + "leases")

	bin := filepath.Join(t.TempDir(), "payments")
	build := exec.CommandContext(b.Ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/examples/payments")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build the payments demo: %v\n%s", err, out)
	}
	demoCtx, stopDemo := context.WithTimeout(b.Ctx, uiDemoRun)
	defer stopDemo()
	demo := exec.CommandContext(demoCtx, bin)
	demo.Env = append(envWithout("DATABASE_URL"), "DATABASE_URL="+b.DB.URL)
	var out lockedBuffer
	demo.Stdout, demo.Stderr = &out, &out
	require.NoError(t, demo.Start())
	var waitErr error
	exited := make(chan struct{}) // closed when the demo has exited, waitErr set
	go func() { waitErr = demo.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = demo.Process.Kill() // an error once it has exited
		<-exited
	})

	// The workers' leases, live.
	page.await("a worker's lease on the leases page", `() =>
		[...document.querySelectorAll("#leases td.holder")].some(td => td.textContent.startsWith("worker-"))`)
	// For the picture, a moment with several leases held, if one comes within a few seconds.
	page.tryAwait(3*time.Second, `() => document.querySelectorAll("#leases tbody tr").length >= 3`)
	page.screenshot("demo-leases.png")
	<-exited // killed when demoCtx ends
	if demoCtx.Err() != nil {
		t.Fatalf("the demo did not end within %v (killed: %v):\n%s", uiDemoRun, waitErr, out.String())
	}
	require.NoError(t, waitErr, "the demo:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Regexp(t, regexp.MustCompile(`^payments: captured=[0-9]+ double_captures=0 stale_writes_rejected=[1-9][0-9]*$`), lines[len(lines)-1])

	var id int
	var worker string
	var token int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT payment_id, worker, token FROM stale_rejections ORDER BY payment_id LIMIT 1`).
		Scan(&id, &worker, &token))
	name := fmt.Sprintf("payment:%d", id)
	page.open(base + "name?n=" + url.QueryEscape(name))
	page.await("the paused worker's grant and another worker's on "+name, `(worker, token) => {
		const rows = [...document.querySelectorAll("#grants tbody tr")].map(r => [r.querySelector(".holder").textContent, r.querySelector(".token").textContent]);
		return rows.some(([h, t]) => h === worker && t === token) && new Set(rows.map(([h]) => h)).size >= 2 &&
			document.querySelectorAll("#timeline rect").length >= 2;
	}`, worker, strconv.FormatInt(token, 10))
	page.screenshot("demo-name.png")
	page.requireNoErrors()
}

// The hang bounds of TestUIPaymentsDemo: the demo's run (which bounds itself to a minute), and
// the whole test.
const (
	uiDemoRun  = 3 * time.Minute
	uiDemoHang = 8 * time.Minute
)

// tryAwait waits at most limit for the JavaScript function cond to return true, and reports
// whether it did; unlike await, it does not fail the test.
func (p *browserPage) tryAwait(limit time.Duration, cond string) bool {
	ctx, cancel := context.WithTimeout(p.ctx, limit)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.PollFunction[bool](cond, chromedp.WithPollingMutation()))
	return err == nil
}
