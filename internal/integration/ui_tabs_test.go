package integration

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// uiTabs is how many tabs of the live view the tests of tabs open in one browser: more than
// the six connections per host a browser opens over HTTP/1.1 (issue 39, item 3: with an event
// stream per tab, a tab opened after six others never loaded).
//
// Seven by default, and the two tests of tabs do not run in parallel: every tab is a renderer
// process, and ten of them twice over, beside the rest of the suite on 2 cores, made the
// heartbeat tests of other packages miss their windows. FENCELOCK_UI_TABS=10 runs the issue's
// ten (docs/RELIABILITY.md has a run of it).
var uiTabs = envInt("FENCELOCK_UI_TABS", 7)

// uiTabsPolls is how many polls after the release's commit the tabs may take to show a
// hand-off, counted by the view's own poll numbers (the live part's data-poll), not by a
// duration the machine must beat: the page served right after the commit shows poll P, so
// P+2 began after the commit (P+1 may have begun before it) and shows the hand-off; one
// poll more for a view the stream skips when its writer runs a whole poll late on a loaded
// machine. A tab that showed it only from a later poll missed the updates between (a stream
// stalled or broken and reopened: EventSource retries after 3 s, 15 polls of 200 ms); one
// that never shows it fails by the bound of each await. The issue asks for uiPromptness (1
// s); a quiet machine shows it in 115-230 ms, and the test logs the delays it saw.
const uiTabsPolls = 3

// uiTabsHang bounds each test of tabs, its build of the command and its browser included: a
// hang bound of its own, as such a test ran 49 s beside a second suite on a loaded 2-core
// machine, too close to the 2 minutes of setup's context, which it shared.
const uiTabsHang = 5 * time.Minute

// uiTabLoad bounds a tab's navigation and its first event: the tabs opening under load.
const uiTabLoad = 30 * time.Second

// The live view in uiTabs tabs of one address: every tab loads and shows a hand-off within
// uiTabsPolls polls of the database's commit of the release that made it.
func TestUIBrowserTabsOfOnePage(t *testing.T) {
	b, base, tabs, lease := uiTabsOf(t, func(int) string { return "leases" })
	uiHandOffInTabs(t, b, base, tabs, lease, "holder-b")
}

// The live view in uiTabs tabs of two pages (leases, and the name page of the lease handed
// off), alternating: every tab loads and shows a hand-off within uiTabsPolls polls; then, the
// tabs of the leases page gone (closed, or gone to another address), the browser's shared
// worker follows a stream of the name page alone (a second after the last leaves, app.js),
// and the tabs of the name page show the next hand-off within uiTabsPolls polls too.
func TestUIBrowserTabsOfTwoPages(t *testing.T) {
	b, base, tabs, lease := uiTabsOf(t, func(i int) string {
		if i%2 == 0 {
			return "leases"
		}
		return "name?n=" + url.QueryEscape(uiTabsLease)
	})
	lease = uiHandOffInTabs(t, b, base, tabs, lease, "holder-b")

	// Tab 1 is the browser's own: it leaves the view; the other leases tabs close. The hand-off
	// comes once the worker's stream is the name page's alone: one that came while it reopened
	// its stream would be judged by a poll the stream skipped meanwhile.
	narrowed := tabs[0].awaitWorkerStream(url.Values{"page": {"name"}, "n": {uiTabsLease}})
	ctx, cancel := context.WithTimeout(tabs[0].ctx, uiTabLoad) // a navigation under load, as openTab's
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "tab 1 leaves the view")
	var left []*browserPage
	for i, tab := range tabs[1:] {
		if i%2 == 0 {
			left = append(left, tab)
			continue
		}
		require.NoError(t, chromedp.Cancel(tab.ctx), "close tab %d", i+2)
	}
	narrowed("the shared worker's stream of the name page alone")
	uiHandOffInTabs(t, b, base, left, lease, "holder-c")
	for _, tab := range left {
		tab.await("the tab live", `() => document.body.dataset.state === "live"`)
	}
}

// uiTabsLease is the lease the tests of tabs hand off.
const uiTabsLease = "tabs:1"

// setupWithin is setup with a context of limit instead of setup's two minutes, for a test
// that builds and starts programs (the command, a browser) as well: they run on that context.
func setupWithin(t *testing.T, limit time.Duration) *bundle {
	t.Helper()
	db := pgtest.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return &bundle{Ctx: ctx, Pool: db.Pool, DB: db}
}

// uiTabsOf starts `fencelock ui` and a Chromium with uiTabs tabs of the live view, tab i at
// page(i), while holder-a holds lease uiTabsLease, all on a context of uiTabsHang; it returns
// once every tab shows that grant, with the view's base URL.
func uiTabsOf(t *testing.T, page func(i int) string) (*bundle, string, []*browserPage, *fencelock.Lease) {
	t.Helper()
	chromium := pgtest.LookProgram(t, "chromium", "apt-get install chromium")
	b := setupWithin(t, uiTabsHang)
	base := startUI(t, b)
	a, err := newLessor(t, b.Pool, "holder-a").TryAcquire(b.Ctx, uiTabsLease, 30*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Release(context.WithoutCancel(b.Ctx)) })
	token := strconv.FormatInt(int64(a.Token()), 10)

	tabs := []*browserPage{newBrowser(t, b.Ctx, chromium)}
	for len(tabs) < uiTabs {
		tabs = append(tabs, tabs[0].newTab())
	}
	for i, tab := range tabs {
		tab.openTab(fmt.Sprintf("tab %d of %d (%s)", i+1, uiTabs, page(i)), base+page(i))
		tab.await("holder-a's grant", handOffShown, uiTabsLease, "holder-a", token)
	}
	return b, base, tabs, a
}

// handOffShown(name, holder, token) is true once the page shows holder holding lease name
// with token (any token if token is ""): its row on the leases page, its holder on its name
// page.
const handOffShown = `(name, holder, token) => {
	let h, t;
	if (document.getElementById("holder")) {
		h = document.querySelector("#holder .holder");
		t = document.querySelector("#holder .token");
	} else {
		const r = [...document.querySelectorAll("#leases tbody tr")].find(r => r.dataset.name === name);
		h = r && r.querySelector("td.holder");
		t = r && r.querySelector("td.token");
	}
	return !!h && h.textContent === holder && (token === "" || t.textContent === token);
}`

// uiHandOffInTabs queues holder to for lease uiTabsLease, which from holds, then releases
// from, which hands the lease to holder in the release's transaction; it returns holder's
// grant. Each tab records (in the page) the poll number of the update that first shows
// holder, and when (on this machine's clock, which the database's shares). Right after the
// release returns, the page served at base shows the view's poll P; every tab must have
// shown holder by poll P + uiTabsPolls (see uiTabsPolls). The delays from holder's
// acquired_at, the start of the release's transaction, are logged.
func uiHandOffInTabs(t *testing.T, b *bundle, base string, tabs []*browserPage, from *fencelock.Lease, to string) *fencelock.Lease {
	t.Helper()
	granted := fencetest.AcquireAsync(b.Ctx, newLessor(t, b.Pool, to), uiTabsLease, 30*time.Second)
	awaitQueue(t, b.Ctx, b.Pool, uiTabsLease, false, to)
	for _, tab := range tabs {
		var ok bool
		tab.eval(`((shown, name, holder) => {
			const at = (window.fencelockShownAt ??= {});
			const poll = (window.fencelockShownPoll ??= {});
			at[holder] = 0;
			const check = () => {
				if (at[holder] || !shown(name, holder, "")) return;
				at[holder] = Date.now();
				poll[holder] = Number(document.querySelector("#live [data-poll]")?.dataset.poll ?? -1);
			};
			new MutationObserver(check).observe(document.getElementById("live"),
				{ subtree: true, childList: true, characterData: true, attributes: true });
			check();
			return at[holder] === 0;
		})(`+handOffShown+`, `+strconv.Quote(uiTabsLease)+`, `+strconv.Quote(to)+`)`, &ok)
		require.True(t, ok, "a tab showed %s before the release", to)
	}

	start := time.Now()
	require.NoError(t, from.Release(b.Ctx))
	released := time.Since(start)
	committed := uiServedPoll(t, b, base)
	g := fencetest.Receive(t, granted, 10*time.Second)
	require.NoError(t, g.Err)
	t.Cleanup(func() { _ = g.Lease.Release(context.WithoutCancel(b.Ctx)) })
	token := strconv.FormatInt(int64(g.Lease.Token()), 10)
	var handedAt time.Time
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT acquired_at FROM fencelock.leases WHERE name = $1 AND token = $2`,
		uiTabsLease, int64(g.Lease.Token())).Scan(&handedAt))

	delays := make([]time.Duration, len(tabs))
	polls := make([]int64, len(tabs))
	for i, tab := range tabs {
		at := tab.awaitValue(fmt.Sprintf("%s in tab %d", to, i+1),
			`(holder) => window.fencelockShownAt[holder] > 0 && window.fencelockShownPoll[holder] + " " + window.fencelockShownAt[holder]`, to)
		var ms int64
		_, err := fmt.Sscanf(at, "%d %d", &polls[i], &ms)
		require.NoError(t, err, "%q", at)
		delays[i] = time.UnixMilli(ms).Sub(handedAt).Round(time.Millisecond)
		tab.await(to+"'s grant with its token", handOffShown, uiTabsLease, to, token)
	}
	t.Logf("%d tabs showed the hand-off to %s at polls %v (the page served after the commit showed poll %d), %v after its transaction began (%v after Release was called, which took %v; poll interval 200ms)",
		len(tabs), to, polls, committed, delays, handedAt.Sub(start).Round(time.Millisecond), released.Round(time.Millisecond))
	for i, p := range polls {
		require.LessOrEqual(t, p, committed+uiTabsPolls, "tab %d showed %s first at poll %d, more than %d polls after poll %d, served after the commit",
			i+1, to, p, uiTabsPolls, committed)
	}
	for _, tab := range tabs {
		tab.requireNoErrors()
	}
	return g.Lease
}

// servedPoll matches the poll number of a page's live part (page.html: data-poll).
var servedPoll = regexp.MustCompile(`data-poll="(\d+)"`)

// uiServedPoll returns the poll number of the live part of the leases page as the view at base
// serves it now: the view's last poll, or the next one if that is old (liveview's Fresh).
func uiServedPoll(t *testing.T, b *bundle, base string) int64 {
	t.Helper()
	body := testkit.Get(t, b.Ctx, base+"leases")
	m := servedPoll.FindSubmatch([]byte(body))
	require.NotNil(t, m, "no poll number in the leases page:\n%s", body)
	n, err := strconv.ParseInt(string(m[1]), 10, 64)
	require.NoError(t, err)
	return n
}

// awaitWorkerStream starts following the network events of the browser's shared worker
// (app.js runs there and holds the event stream its tabs share), and returns a function that
// waits, at most uiTabLoad, until the worker has opened a stream of the pages in query and
// that stream has delivered an event, failing the test with what when it has not.
func (p *browserPage) awaitWorkerStream(query url.Values) (wait func(what string)) {
	p.t.Helper()
	infos, err := chromedp.Targets(p.ctx)
	require.NoError(p.t, err)
	var workers []*target.Info
	for _, info := range infos {
		if info.Type == "shared_worker" {
			workers = append(workers, info)
		}
	}
	require.Len(p.t, workers, 1, "the browser's shared workers: the tabs share one stream")
	want := query.Encode()
	var mu sync.Mutex
	streams := map[network.RequestID]bool{}
	delivered := make(chan struct{})
	var once sync.Once
	ctx, cancel := chromedp.NewContext(p.ctx, chromedp.WithTargetID(workers[0].TargetID), chromedp.WithDetachOnCancel(),
		chromedp.WithListener(func(ev any) {
			mu.Lock()
			defer mu.Unlock()
			switch ev := ev.(type) {
			case *network.EventRequestWillBeSent:
				if u, err := url.Parse(ev.Request.URL); err == nil && u.Path == "/events" && u.Query().Encode() == want {
					streams[ev.RequestID] = true
				}
			case *network.EventEventSourceMessageReceived:
				if streams[ev.RequestID] {
					once.Do(func() { close(delivered) })
				}
			}
		}))
	p.t.Cleanup(cancel)
	require.NoError(p.t, chromedp.Do(ctx), "follow the shared worker's network events")
	return func(what string) {
		p.t.Helper()
		select {
		case <-delivered:
		case <-time.After(uiTabLoad):
			p.t.Fatalf("no event of %s (events?%s) within %v", what, want, uiTabLoad)
		}
	}
}

// newTab opens another tab in p's browser, closed at cleanup.
func (p *browserPage) newTab() *browserPage {
	p.t.Helper()
	q := &browserPage{t: p.t}
	ctx, cancel := chromedp.NewContext(p.ctx, chromedp.WithListener(q.listen))
	p.t.Cleanup(cancel)
	q.ctx = ctx
	// The first Run creates the tab, bound to the context it is given: no timeout of its own.
	require.NoError(p.t, chromedp.Do(ctx), "open a tab")
	return q
}

// openTab is open for the tab named what, with a failure that says which tab did not load.
func (p *browserPage) openTab(what, url string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, uiTabLoad)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		p.t.Fatalf("%s did not load %s: %v", what, strings.TrimPrefix(url, "http://"), err)
	}
	p.await(what+"'s event stream", `() => document.body.dataset.state === "live"`)
}

// envInt returns the environment variable name as a positive integer, or def when it is unset;
// it panics on anything else (a mistyped opt-in must not pass silently as the default).
func envInt(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		panic(fmt.Sprintf("%s=%q: want a positive integer", name, v))
	}
	return n
}
