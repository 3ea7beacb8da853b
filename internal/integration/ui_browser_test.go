package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// Tests of the live view in a real browser: `fencelock ui`, built and run as a process with
// forced releases allowed, driven by headless Chromium (chromedp), while leases are held by
// child processes (this test binary run again as TestUIChildHolder) and by the test itself.

// The environment of a holder child process (see TestUIChildHolder): the lease it takes, its
// holder id and the database.
const (
	uiChildEnv       = "FENCELOCK_UI_CHILD"
	uiChildHolderEnv = "FENCELOCK_UI_CHILD_HOLDER"
	uiChildURLEnv    = "FENCELOCK_UI_CHILD_URL"
)

// uiSecret is the access token of forced releases given to `fencelock ui`.
const uiSecret = "browser-test-access-token-0123456789"

// uiPromptness is how soon after a grant the page must show it (the requirement).
const uiPromptness = time.Second

// The live view in Chromium, from the leases a child process holds to a forced release:
//
//   - the leases page shows the child's lease (holder, token), then its waiter, then the
//     waiter's grant within a second of the child's release;
//   - the name page shows both grants in its table and in its timeline's tooltips;
//   - a forced release from the page is refused without the access token (the lease stays
//     the child's), done with it, and the child's fenced write is then refused.
//
// FENCELOCK_SCREENSHOTS=DIR writes leases.png and name.png to DIR.
func TestUIBrowser(t *testing.T) {
	t.Parallel()
	chromium := pgtest.LookProgram(t, "chromium", "apt-get install chromium")
	b := setup(t)
	fencetest.CreateWrites(t, b.Ctx, b.Pool)
	base := startUI(t, b)
	page := newBrowser(t, b.Ctx, chromium)

	// 1. A lease held by another process shows on the leases page.
	child := startUIChild(t, b, "payment:1", "child-worker")
	page.open(base + "leases")
	page.await("the child's lease on the leases page", leaseRowIs, "payment:1", "child-worker", strconv.FormatInt(child.token, 10))

	// 2. A waiter queues; the page names it next; the child releases; the page shows the
	// waiter's grant within uiPromptness.
	waiter := newLessor(t, b.Pool, "waiter-2")
	granted := fencetest.AcquireAsync(b.Ctx, waiter, "payment:1", 30*time.Second)
	awaitQueue(t, b.Ctx, b.Pool, "payment:1", false, "waiter-2")
	page.await("the waiter as next on the leases page", leaseNextIs, "payment:1", "waiter-2")
	child.tell("release")
	child.expect("released")
	released := time.Now()
	shown := page.awaitValue("the waiter's grant on the leases page", leaseRowToken, "payment:1", "waiter-2")
	delay := time.Since(released)
	// What seeing it costs the test, measured at once on the same page: an await of what is
	// shown already (a CDP round trip and the page's script, slow alike on a loaded machine).
	control := time.Now()
	page.awaitValue("the waiter's grant on the leases page, again", leaseRowToken, "payment:1", "waiter-2")
	looking := time.Since(control)
	t.Logf("the leases page showed the hand-off %v after the holder's release returned (poll interval 200ms; one look costs %v)", delay.Round(time.Millisecond), looking.Round(time.Millisecond))
	g := fencetest.Receive(t, granted, 10*time.Second)
	require.NoError(t, g.Err)
	t.Cleanup(func() { _ = g.Lease.Release(context.WithoutCancel(b.Ctx)) })
	require.Equal(t, strconv.FormatInt(int64(g.Lease.Token()), 10), shown, "the token the page shows for waiter-2")
	require.Greater(t, int64(g.Lease.Token()), child.token)
	require.LessOrEqual(t, delay-looking, uiPromptness, "the page showed the new holder too late")

	// 3. The name page: both grants, in the table and in the timeline's tooltips.
	page.open(base + "name?n=" + url.QueryEscape("payment:1"))
	page.await("both grants on the name page", grantsShown,
		"child-worker", strconv.FormatInt(child.token, 10), "waiter-2", strconv.FormatInt(int64(g.Lease.Token()), 10))
	var grants struct {
		Rows   [][]string `json:"rows"`
		Titles []string   `json:"titles"`
		Holder string     `json:"holder"`
	}
	page.eval(`({
		rows: [...document.querySelectorAll("#grants tbody tr")].map(r => [...r.cells].map(c => c.textContent)),
		titles: [...document.querySelectorAll("#timeline title")].map(e => e.textContent),
		holder: document.querySelector("#holder .holder")?.textContent ?? "",
	})`, &grants)
	require.Equal(t, "waiter-2", grants.Holder)
	require.Len(t, grants.Rows, 2, "grants: %q", grants.Rows)
	require.Equal(t, []string{"child-worker", strconv.FormatInt(child.token, 10), "released"},
		[]string{grants.Rows[0][1], grants.Rows[0][2], grants.Rows[0][4]})
	require.Equal(t, []string{"waiter-2", strconv.FormatInt(int64(g.Lease.Token()), 10), "held"},
		[]string{grants.Rows[1][1], grants.Rows[1][2], grants.Rows[1][4]})
	require.Len(t, grants.Titles, 2, "timeline: %q", grants.Titles)
	require.True(t, strings.HasPrefix(grants.Titles[0], fmt.Sprintf("child-worker, token %d, granted ", child.token)), grants.Titles[0])
	require.True(t, strings.HasSuffix(grants.Titles[0], ", released at "+grants.Rows[0][3]), grants.Titles[0])
	require.True(t, strings.HasPrefix(grants.Titles[1], fmt.Sprintf("waiter-2, token %d, granted ", g.Lease.Token())), grants.Titles[1])
	require.True(t, strings.HasSuffix(grants.Titles[1], ", held"), grants.Titles[1])
	page.screenshot("name.png")

	// 4. A forced release from the page: refused without the access token, then done with it;
	// the old holder's fenced write is then refused.
	other := startUIChild(t, b, "payment:2", "child-worker-2")
	otherToken := strconv.FormatInt(other.token, 10)
	page.open(base + "leases")
	page.await("the second child's lease on the leases page", leaseRowIs, "payment:2", "child-worker-2", otherToken)
	page.screenshot("leases.png")

	page.forceRelease("payment:2", "child-worker-2", otherToken, "")
	status := page.awaitStatus("the refusal", "err")
	require.True(t, strings.HasPrefix(status, "not authenticated"), "status: %q", status)
	require.Equal(t, leaseRow{Holder: "child-worker-2", Token: other.token}, readLease(t, b.Ctx, b.Pool, "payment:2"),
		"a refused forced release changed the lease")

	page.forceRelease("payment:2", "child-worker-2", otherToken, uiSecret)
	status = page.awaitStatus("the release", "ok")
	var fence int64
	_, err := fmt.Sscanf(status, "released lease \"payment:2\" held by child-worker-2 (token "+otherToken+"); fenced with token %d (payment:2)", &fence)
	require.NoError(t, err, "status: %q", status)
	require.Greater(t, fence, other.token)
	// force_release leaves the row ended, with the fence token, until the next grant.
	require.Equal(t, leaseRow{Holder: "fencelock force-release", Token: fence, Expired: true}, readLease(t, b.Ctx, b.Pool, "payment:2"))
	page.await("the released lease gone from the leases page", leaseRowGone, "payment:2")
	other.tell("write")
	other.expect("stale")
	require.Empty(t, writtenTokens(t, b, "payment:2"), "the old holder's fenced write went through")
	page.requireNoErrors()
}

// TestUIChildHolder is the holder child process of TestUIBrowser, and returns at once unless
// FENCELOCK_UI_CHILD names a lease. Then it takes that lease for 30 s as
// FENCELOCK_UI_CHILD_HOLDER on the database FENCELOCK_UI_CHILD_URL, prints "token N", and
// reads one line on stdin: "release" releases the lease and prints "released"; "write" makes
// a fenced write (fencelock.FenceTx on the lease's name, then an insert) with its token and
// prints "ok" or "stale"; end of input releases the lease. Any failure prints "error: ...".
func TestUIChildHolder(t *testing.T) {
	name := os.Getenv(uiChildEnv)
	if name == "" {
		return
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(uiChildURLEnv))
	if err != nil {
		fail(err)
	}
	defer pool.Close()
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder(os.Getenv(uiChildHolderEnv)))
	if err != nil {
		fail(err)
	}
	lease, err := l.TryAcquire(ctx, name, 30*time.Second)
	if err != nil {
		fail(err)
	}
	defer lease.Release(context.WithoutCancel(ctx)) //nolint:errcheck // the grant may be gone: released, or forced
	fmt.Println("token", int64(lease.Token()))
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	switch cmd := strings.TrimSpace(line); {
	case cmd == "release":
		if err := lease.Release(ctx); err != nil {
			fail(err)
		}
		fmt.Println("released")
	case cmd == "write":
		err := fencetest.FencedWrite(ctx, pool, name, lease.Token())
		switch {
		case errors.Is(err, fencelock.ErrStaleToken):
			fmt.Println("stale")
		case err != nil:
			fail(err)
		default:
			fmt.Println("ok")
		}
	case err != nil: // end of input: the test is over
	default:
		fail(fmt.Errorf("unknown command %q", cmd))
	}
}

// uiChild is the test's handle on a holder child process (TestUIChildHolder).
type uiChild struct {
	t      *testing.T
	name   string
	token  int64
	stdin  io.WriteCloser
	lines  chan string   // its lines on stdout; closed at end of output
	exited chan struct{} // closed once it has exited
}

// startUIChild runs this test binary as a holder child of lease name as holder, and returns
// once it holds the lease. At cleanup its stdin closes (it releases the lease and exits); it
// is killed after 10 s.
func startUIChild(t *testing.T, b *bundle, name, holder string) *uiChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestUIChildHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), uiChildEnv+"="+name, uiChildHolderEnv+"="+holder, uiChildURLEnv+"="+b.DB.URL)
	stdin, stdout := testkit.StartPiped(t, cmd)
	c := &uiChild{t: t, name: name, stdin: stdin, lines: make(chan string, 16), exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("holder child of %q did not exit within 10s of the end of its input: killed", name)
			_ = cmd.Process.Kill()
			<-c.exited
		}
	})
	tok, ok := strings.CutPrefix(c.expect("token "), "token ")
	require.True(t, ok)
	var err error
	c.token, err = strconv.ParseInt(tok, 10, 64)
	require.NoError(t, err)
	return c
}

// tell writes a command line to the child.
func (c *uiChild) tell(cmd string) {
	c.t.Helper()
	_, err := io.WriteString(c.stdin, cmd+"\n")
	require.NoError(c.t, err)
}

// expect returns the child's next line of its protocol (skipping those of the test framework),
// failing the test unless it starts with prefix or when none comes within 10 s.
func (c *uiChild) expect(prefix string) string {
	c.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-c.lines:
			switch {
			case !ok:
				c.t.Fatalf("holder child of %q exited before printing %q", c.name, prefix)
			case strings.HasPrefix(line, prefix):
				return line
			case strings.HasPrefix(line, "error:"), strings.HasPrefix(line, "token "),
				line == "released", line == "ok", line == "stale":
				c.t.Fatalf("holder child of %q printed %q, want %q", c.name, line, prefix)
			}
		case <-timeout:
			c.t.Fatalf("holder child of %q did not print %q within 10s", c.name, prefix)
		}
	}
}

// startUI builds the fencelock command and runs `fencelock ui` on b's database, polling every
// 200 ms with forced releases allowed (the access token uiSecret), on a port of its own; it
// returns the view's base URL ("http://ADDR/"). At cleanup it sends SIGTERM and checks that the
// command exits with status 0 within 10 s.
func startUI(t *testing.T, b *bundle) string {
	t.Helper()
	return startUIAt(t, b, b.DB.URL)
}

// startUIAt is startUI with the database URL given (through a pooler, say).
func startUIAt(t *testing.T, b *bundle, dbURL string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fencelock")
	// go test puts its own GOROOT/bin first on the PATH of the test.
	build := exec.CommandContext(b.Ctx, "go", "build", "-o", bin, "github.com/fencelock/fencelock/cmd/fencelock")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	cmd := exec.Command(bin, "ui", "--database-url", dbURL, "--listen", "127.0.0.1:0",
		"--interval", "200ms", "--allow-release")
	cmd.Env = append(envWithout("DATABASE_URL"), "FENCELOCK_UI_SECRET="+uiSecret)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("fencelock ui did not exit cleanly on SIGTERM: %v; its stderr:\n%s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("fencelock ui did not exit within 10s of SIGTERM: killed; its stderr:\n%s", stderr.String())
		}
		if t.Failed() {
			t.Logf("fencelock ui's stderr:\n%s", stderr.String())
		}
	})
	var line string
	select {
	case line = <-first:
	case <-time.After(20 * time.Second):
		t.Fatalf("fencelock ui printed nothing within 20s; its stderr:\n%s", stderr.String())
	}
	addr, ok := strings.CutPrefix(line, "fencelock ui: serving http://")
	addr, _, found := strings.Cut(addr, "/ (")
	require.True(t, ok && found, "fencelock ui's first line: %q; its stderr:\n%s", line, stderr.String())
	return "http://" + addr + "/"
}

// lockedBuffer is a bytes.Buffer safe for a writing process and a reading test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// browserPage is one tab of a headless Chromium, with the console errors and uncaught
// exceptions of its pages.
type browserPage struct {
	t   *testing.T
	ctx context.Context // the tab's; each action runs with a timeout of its own

	mu     sync.Mutex
	errors []string
}

// newBrowser starts the Chromium at path headless (without its sandbox: the tests may run as
// root), with one tab, closed at cleanup.
func newBrowser(t *testing.T, ctx context.Context, path string) *browserPage {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 900))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	p := &browserPage{t: t}
	tabCtx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(p.listen))
	t.Cleanup(cancelTab)
	p.ctx = tabCtx
	// The first Run starts the browser, bound to the context it is given: this one has no
	// timeout of its own.
	require.NoError(t, chromedp.Do(tabCtx), "start %s", path)
	return p
}

// listen records the page's console errors and uncaught exceptions; chromedp calls it in its
// reading loop.
func (p *browserPage) listen(ev any) {
	var msg string
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type != runtime.ConsoleAPICalledTypeError && ev.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		var args []string
		for _, a := range ev.Args {
			switch {
			case len(a.Value) > 0:
				args = append(args, string(a.Value))
			case a.Description != "":
				args = append(args, a.Description)
			}
		}
		msg = "console." + string(ev.Type) + ": " + strings.Join(args, " ")
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg = fmt.Sprintf("uncaught exception at %s:%d: %s", d.URL, d.LineNumber+1, d.Text)
		if d.Exception != nil && d.Exception.Description != "" {
			msg += " " + d.Exception.Description
		}
	default:
		return
	}
	p.mu.Lock()
	p.errors = append(p.errors, msg)
	p.mu.Unlock()
}

// requireNoErrors fails the test if a page logged an error or threw.
func (p *browserPage) requireNoErrors() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(p.t, p.errors, "the pages' console errors and uncaught exceptions")
}

// step returns a context for one action: uiStepHang at most.
func (p *browserPage) step() (context.Context, context.CancelFunc) {
	return context.WithTimeout(p.ctx, uiStepHang)
}

// uiStepHang bounds one action on a page and each wait for what a page shows: a hang bound,
// not the machine's speed (two copies of the suite under four busy loops made chromium take
// more than 10 s over a forced release's clicks and waits, which then shared one bound).
const uiStepHang = 30 * time.Second

// open loads url and waits until its event stream has delivered a first update.
func (p *browserPage) open(url string) {
	p.t.Helper()
	ctx, cancel := p.step()
	defer cancel()
	require.NoError(p.t, chromedp.Do(ctx, chromedp.Navigate(url)), "open %s", url)
	p.await("the page's event stream", `() => document.body.dataset.state === "live"`)
}

// The conditions of await and awaitValue on the live part of a page: functions of the
// arguments given, true (or the value awaited) once the page shows what is awaited.
const (
	// leaseRowIs(name, holder, token): the leases page's row of name shows holder and token.
	leaseRowIs = `(name, holder, token) => {
		const r = [...document.querySelectorAll("#leases tbody tr")].find(r => r.dataset.name === name);
		return !!r && r.querySelector("td.holder").textContent === holder && r.querySelector("td.token").textContent === token;
	}`
	// leaseNextIs(name, holder): the leases page's row of name has holder next in its queue.
	leaseNextIs = `(name, holder) => {
		const r = [...document.querySelectorAll("#leases tbody tr")].find(r => r.dataset.name === name);
		return !!r && r.cells[6].textContent === "1 (next: " + holder + ")";
	}`
	// leaseRowToken(name, holder): the token of the leases page's row of name once holder
	// holds it.
	leaseRowToken = `(name, holder) => {
		const r = [...document.querySelectorAll("#leases tbody tr")].find(r => r.dataset.name === name);
		return !!r && r.querySelector("td.holder").textContent === holder && r.querySelector("td.token").textContent;
	}`
	// leaseRowGone(name): the leases page shows no row of name.
	leaseRowGone = `(name) => !!document.querySelector("#live [data-poll]") &&
		![...document.querySelectorAll("#leases tbody tr")].some(r => r.dataset.name === name)`
	// grantsShown(holder1, token1, holder2, token2): the name page's table of grants and its
	// timeline's tooltips both show the grant of each holder with its token.
	grantsShown = `(h1, t1, h2, t2) => {
		const rows = [...document.querySelectorAll("#grants tbody tr")].map(r => r.querySelector(".holder").textContent + " " + r.querySelector(".token").textContent);
		const titles = [...document.querySelectorAll("#timeline title")].map(e => e.textContent);
		return [[h1, t1], [h2, t2]].every(([h, t]) => rows.includes(h + " " + t) && titles.some(s => s.startsWith(h + ", token " + t + ",")));
	}`
)

// await waits, at most 10 s, until the JavaScript function cond returns true for args,
// checking it on each change of the page's DOM; it fails the test, showing the live part of
// the page, when it does not.
func (p *browserPage) await(what, cond string, args ...any) {
	p.t.Helper()
	p.awaitValue(what, `(...args) => (`+cond+`)(...args) ? "yes" : false`, args...)
}

// awaitValue is await for a condition that returns the value awaited (a string) or false.
func (p *browserPage) awaitValue(what, cond string, args ...any) string {
	p.t.Helper()
	ctx, cancel := p.step()
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.PollFunction[string](cond,
		chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(uiStepHang), chromedp.WithPollingArgs(args...)))
	if err != nil {
		p.t.Fatalf("the page did not show %s within %v: %v; its live part:\n%s", what, uiStepHang, err, p.live())
	}
	return v
}

// live returns the live part of the page and its status line, for a failure's message.
func (p *browserPage) live() string {
	ctx, cancel := p.step()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`document.getElementById("live")?.outerHTML + "\n" + document.getElementById("status")?.outerHTML`))
	if err != nil {
		return "(not read: " + err.Error() + ")"
	}
	return s
}

// eval evaluates a JavaScript expression and decodes its value into v.
func (p *browserPage) eval(expr string, v any) {
	p.t.Helper()
	ctx, cancel := p.step()
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr))
	require.NoError(p.t, err)
	require.NoError(p.t, json.Unmarshal(raw, v), "%s", raw)
}

// forceRelease clicks the force release button of lease name's row, checks that the
// confirmation names holder and token, types secret as the access token (none when empty)
// and confirms.
func (p *browserPage) forceRelease(name, holder, token, secret string) {
	p.t.Helper()
	ctx, cancel := p.step()
	defer cancel()
	// An update changes only the nodes that differ: the button focused before a poll is the
	// same element after it (the focus and a press in progress survive), and a click on it
	// opens the confirmation.
	var poll int64
	_, err := chromedp.Run(ctx, chromedp.PollFunction[bool](`(name) => {
		const r = [...document.querySelectorAll("#leases tbody tr")].find(r => r.dataset.name === name);
		const b = r && r.querySelector("button[data-release]");
		if (!b) return false;
		b.scrollIntoView({block: "center"});
		b.focus();
		return true;
	}`, chromedp.WithPollingMutation(), chromedp.WithPollingArgs(name)))
	require.NoError(p.t, err, "no force release button for %q; the page:\n%s", name, p.live())
	p.eval(`Number(document.querySelector("[data-poll]").dataset.poll)`, &poll)
	p.await("a later poll", `(n) => Number(document.querySelector("[data-poll]").dataset.poll) > n`, poll)
	var focused bool
	p.eval(`document.activeElement.matches("button[data-release]") && document.activeElement.dataset.name === `+strconv.Quote(name), &focused)
	require.True(p.t, focused, "the focused force release button of %q did not survive an update", name)
	cancel()
	ctx, cancel = p.step() // the dialog's steps, each bounded on their own
	defer cancel()
	require.NoError(p.t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`#leases tr[data-name="`+name+`"] button[data-release]`)),
		chromedp.WaitVisible(chromedp.CSS("dialog#confirm[open]")),
	), "open the confirmation of %q", name)
	var shown []string
	p.eval(`[...["c-name", "c-holder", "c-token"].map(id => document.getElementById(id).textContent),
		...["c-fence", "c-secret"].map(id => document.getElementById(id).value)]`, &shown)
	require.Equal(p.t, []string{name, holder, token, "", ""}, shown, "the confirmation (no fence, no access token typed)")
	if secret != "" {
		require.NoError(p.t, chromedp.Do(ctx, chromedp.SendKeys(chromedp.ID("c-secret"), secret)))
	}
	// The status line is cleared so that awaitStatus sees this answer.
	require.NoError(p.t, chromedp.Do(ctx,
		chromedp.Evaluate[chromedp.Void](`document.getElementById("status").textContent = ""`),
		chromedp.Click(chromedp.ID("c-go")),
		chromedp.WaitNotVisible(chromedp.CSS("dialog#confirm")),
	), "confirm the forced release of %q", name)
}

// awaitStatus waits for the answer to a forced release in the status line, with class
// (ok or err), and returns its text.
func (p *browserPage) awaitStatus(what, class string) string {
	p.t.Helper()
	return p.awaitValue(what, `(cls) => {
		const s = document.getElementById("status");
		return s.textContent !== "" && s.className === cls && s.textContent;
	}`, class)
}

// screenshot saves the whole page as file in the directory FENCELOCK_SCREENSHOTS names, if
// it names one.
func (p *browserPage) screenshot(file string) {
	p.t.Helper()
	dir := os.Getenv("FENCELOCK_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := p.step()
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(p.t, err)
	require.NoError(p.t, os.MkdirAll(dir, 0o755))
	require.NoError(p.t, os.WriteFile(filepath.Join(dir, file), png, 0o644))
	p.t.Logf("screenshot: %s", filepath.Join(dir, file))
}
