package ui_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/pgserver"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/ui"
)

type bundle = testkit.Bundle[*pgserver.DB]

const secret = "s3cret-access-token-for-tests"

// serve starts h on a test server, closed (with h) at cleanup, and returns its base URL.
func serve(t testing.TB, h *ui.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() { h.Close(); srv.Close() })
	return srv.URL + "/"
}

func newHandler(t *testing.T, pool *pgxpool.Pool, opts ...ui.Option) *ui.Handler {
	t.Helper()
	h, err := ui.New(pool, append([]ui.Option{ui.WithInterval(100 * time.Millisecond)}, opts...)...)
	require.NoError(t, err)
	return h
}

func get(t *testing.T, ctx context.Context, u string) string {
	t.Helper()
	return testkit.Get(t, ctx, u)
}

// events opens a page's event stream and returns the data of each event as it comes.
func events(t testing.TB, ctx context.Context, base, page, name string) <-chan string {
	t.Helper()
	q := url.Values{"page": {page}}
	if name != "" {
		q.Set("n", name)
	}
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"events?"+q.Encode(), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	out := make(chan string, 64)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			case line == "" && data != nil:
				select {
				case out <- strings.Join(data, "\n"):
				case <-ctx.Done():
					return
				}
				data = nil
			}
		}
	}()
	return out
}

// awaitEvent returns the first event of ch for which match holds, failing t if none comes
// within limit.
func awaitEvent(t *testing.T, ch <-chan string, limit time.Duration, what string, match func(string) bool) string {
	t.Helper()
	deadline := time.After(limit)
	last := ""
	for {
		select {
		case data, ok := <-ch:
			require.True(t, ok, "event stream ended before %s; last event:\n%s", what, last)
			if match(data) {
				return data
			}
			last = data
		case <-deadline:
			t.Fatalf("no event within %v shows %s; last event:\n%s", limit, what, last)
		}
	}
}

// hold returns the grant of name, for a minute, to a new lessor of holder on b's pool.
func hold(t *testing.T, b *bundle, holder, name string) *fencelock.Lease {
	t.Helper()
	l, err := fencetest.NewLessor(t, b.Pool, holder).TryAcquire(b.Ctx, name, time.Minute)
	require.NoError(t, err)
	return l
}

func contains(subs ...string) func(string) bool {
	return func(s string) bool {
		for _, sub := range subs {
			if !strings.Contains(s, sub) {
				return false
			}
		}
		return true
	}
}

func TestPagesShowWhatIsHeld(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	lease := hold(t, b, "worker-1", "payment:42")
	base := serve(t, newHandler(t, b.Pool))

	page := get(t, b.Ctx, base)
	require.Contains(t, page, "worker-1")
	require.Contains(t, page, fmt.Sprint(int64(lease.Token())))
	require.Contains(t, page, `href="name?n=payment%3a42"`)
	require.NotContains(t, page, "force release", "a read-only view offers no forced release")
	for _, p := range []string{"leases", "advisory", "semaphores", "elections", "jobs", "fences", "ratelimits", "name?n=payment:42", "app.js", "style.css"} {
		get(t, b.Ctx, base+p)
	}
	require.Contains(t, get(t, b.Ctx, base+"name?n=payment:42"), "worker-1")
}

// TestEventsFollowAHandOff: a page's stream shows the waiter as the next holder, then as the
// holder with its token once the first releases, and the name's timeline shows both grants.
func TestEventsFollowAHandOff(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	first := hold(t, b, "worker-1", "payment:7")
	base := serve(t, newHandler(t, b.Pool))
	leases := events(t, b.Ctx, base, "leases", "")
	timeline := events(t, b.Ctx, base, "name", "payment:7")
	awaitEvent(t, leases, 10*time.Second, "worker-1 holding", contains("worker-1", fmt.Sprint(int64(first.Token()))))

	got := make(chan *fencelock.Lease, 1)
	go func() {
		l, err := fencetest.NewLessor(t, b.Pool, "worker-2").Acquire(b.Ctx, "payment:7", time.Minute)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	awaitEvent(t, leases, 10*time.Second, "worker-2 as the next holder", contains("(next: worker-2)"))
	awaitEvent(t, timeline, 10*time.Second, "worker-2 in the queue", contains(`<ol id="queue"><li><span class="holder">worker-2</span>`))
	require.NoError(t, first.Release(b.Ctx))
	second := testkit.Receive(t, got, 10*time.Second, "worker-2's grant")
	require.NotNil(t, second)

	t1, t2 := fmt.Sprint(int64(first.Token())), fmt.Sprint(int64(second.Token()))
	awaitEvent(t, leases, 10*time.Second, "worker-2 holding with its token", func(s string) bool {
		return contains("worker-2", t2)(s) && !strings.Contains(s, "worker-1")
	})
	data := awaitEvent(t, timeline, 10*time.Second, "both grants in the timeline", contains(t1, t2, "released", "<svg"))
	require.Regexp(t, regexp.MustCompile(`worker-1</td><td class="token">`+t1+`</td><td>[0-9:.]+</td><td>released`), data)
}

// releaseForm posts a forced release of (name, holder, token) to base with the given headers.
func releaseForm(t *testing.T, ctx context.Context, base string, header http.Header, name, holder string, token int64, fence ...string) (int, string) {
	t.Helper()
	form := url.Values{"name": {name}, "holder": {holder}, "token": {fmt.Sprint(token)}, "fence": fence}
	code, body := rawRelease(t, ctx, http.MethodPost, base+"release", header, strings.NewReader(form.Encode()))
	var rep struct {
		OK      bool   `json:"ok"`
		Message string `json:"message"`
	}
	require.NoError(t, json.NewDecoder(strings.NewReader(body)).Decode(&rep))
	require.Equal(t, code == http.StatusOK, rep.OK)
	return code, rep.Message
}

var csrfMeta = regexp.MustCompile(`<meta name="fencelock-csrf" content="([0-9a-f]+)">`)

// TestForcedReleaseDoor: each refused request changes nothing and says why; the accepted one
// ends the grant it names, and its holder's fenced write is refused afterwards.
func TestForcedReleaseDoor(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	fencetest.CreateWrites(t, b.Ctx, b.Pool)
	lease := hold(t, b, "worker-1", "payment:9")
	token := int64(lease.Token())
	require.NoError(t, fencetest.FencedWrite(b.Ctx, b.Pool, "payment:9", lease.Token()))

	readOnly := serve(t, newHandler(t, b.Pool))
	base, good := doorOpen(t, b)
	csrf := good.Get("X-Fencelock-Csrf")
	with := func(k, v string) http.Header { h := good.Clone(); h.Set(k, v); return h }
	without := func(k string) http.Header { h := good.Clone(); h.Del(k); return h }

	for _, tc := range []struct {
		name   string
		base   string
		header http.Header
		holder string
		token  int64
		code   int
		says   string
	}{
		{"ReadOnlyView", readOnly, good, "worker-1", token, http.StatusForbidden, "read-only"},
		{"CrossSite", base, with("Sec-Fetch-Site", "cross-site"), "worker-1", token, http.StatusForbidden, "cross-origin"},
		{"NoCSRFToken", base, without("X-Fencelock-Csrf"), "worker-1", token, http.StatusForbidden, "CSRF"},
		{"WrongCSRFToken", base, with("X-Fencelock-Csrf", strings.Repeat("0", len(csrf))), "worker-1", token, http.StatusForbidden, "CSRF"},
		{"NoCredentials", base, without("Authorization"), "worker-1", token, http.StatusUnauthorized, "no credentials"},
		{"WrongSecret", base, with("Authorization", "Bearer nope-nope-nope-nope"), "worker-1", token, http.StatusUnauthorized, "wrong access token"},
		{"WrongBasicPassword", base, with("Authorization", "Basic b3A6bm9wZQ=="), "worker-1", token, http.StatusUnauthorized, "wrong password"},
		{"BadToken", base, good, "worker-1", 0, http.StatusBadRequest, "token"},
		{"NotTheLastGrant", base, good, "worker-1", token - 1, http.StatusConflict, "nothing changed"},
		{"NotItsHolder", base, good, "worker-2", token, http.StatusConflict, "nothing changed"},
	} {
		code, msg := releaseForm(t, b.Ctx, tc.base, tc.header, "payment:9", tc.holder, tc.token)
		require.Equal(t, tc.code, code, "%s: %s", tc.name, msg)
		require.Contains(t, msg, tc.says, tc.name)
		row := testkit.ReadLease(t, b.Ctx, b.Pool, "payment:9")
		require.Equal(t, token, row.Token, "%s changed the lease", tc.name)
		require.Equal(t, "worker-1", row.Holder, tc.name)
		require.NoError(t, fencetest.FencedWrite(b.Ctx, b.Pool, "payment:9", lease.Token()), "%s fenced the holder out", tc.name)
	}

	code, msg := releaseForm(t, b.Ctx, base, with("Authorization", "Basic b3A6"+basicPassword(secret)), "payment:9", "worker-1", token, "ledger:9")
	require.Equal(t, http.StatusOK, code, msg)
	require.Contains(t, msg, fmt.Sprintf(`released lease "payment:9" held by worker-1 (token %d)`, token))
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, fencetest.FencedWrite(b.Ctx, b.Pool, "payment:9", lease.Token()), &stale, "the old holder's fenced write after the forced release")
	require.ErrorAs(t, fencetest.FencedWrite(b.Ctx, b.Pool, "ledger:9", lease.Token()), &stale, "the extra fence")
	spans := events(t, b.Ctx, base, "name", "payment:9")
	awaitEvent(t, spans, 10*time.Second, "the forced release in the timeline", contains("forced release", fmt.Sprint(token)))
}

// basicPassword is the base64 of ":"+password's tail for "op:"+password: the test's basic
// credentials are "op" and password, encoded by net/http's own SetBasicAuth.
func basicPassword(password string) string {
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth("op", password)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic b3A6")
}

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}
func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

var pollNumber = regexp.MustCompile(`data-poll="([0-9]+)"`)

func pollOf(t *testing.T, data string) int64 {
	t.Helper()
	m := pollNumber.FindStringSubmatch(data)
	require.NotNil(t, m, "an update names its poll")
	n, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return n
}

// TestOnePollFeedsEveryPage: with 1 page open and then 20, every page follows the polls, and
// the reader sends one statement per poll and none per page: once every page has left and the
// poller has idled, a page's GET gets poll N, and N statements were sent in all. (Counted at rest, so a slow reader of the streams cannot skew it.)
func TestOnePollFeedsEveryPage(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	tr := &countingTracer{}
	reader := testkit.NewPool(t, b.Ctx, b.DB.URL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	base := serve(t, newHandler(t, reader))
	for _, pages := range []int{1, 20} {
		ctx, cancel := context.WithCancel(b.Ctx)
		streams := make([]<-chan string, pages)
		for i := range streams {
			streams[i] = events(t, ctx, base, "leases", "")
		}
		first := make([]int64, pages)
		for i, s := range streams {
			first[i] = pollOf(t, awaitEvent(t, s, 10*time.Second, "a first update", contains("database clock")))
		}
		last := slices.Max(first) + 10
		for i, s := range streams { // ten polls later, on every page (a page late to read gets the latest)
			awaitEvent(t, s, 20*time.Second, fmt.Sprintf("poll %d on page %d", last, i+1), func(d string) bool { return pollOf(t, d) >= last })
		}
		cancel()
		for _, s := range streams {
			for range s { // the stream ended
			}
		}
	}
	testkit.WaitFor(t, b.Ctx, "the poller to idle", func() bool {
		n := tr.n.Load()
		time.Sleep(300 * time.Millisecond) // three intervals with no statement
		return tr.n.Load() == n
	})
	// A page's GET on an idle poller waits for one fresh poll (a stream would first show the
	// last view, then keep polling).
	polls := pollOf(t, get(t, b.Ctx, base))
	require.Equal(t, polls, tr.n.Load(), "statements sent against polls run, after 1 and then 20 pages")
}

// TestReadOnlyRole: the poller reads everything under a role that may only SELECT.
func TestReadOnlyRole(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	// README's read-only role ("Least privilege"), without pg_read_all_stats.
	_, reader := testkit.NewRole(t, b.Ctx, b.Pool, b.DB.URL, `GRANT USAGE ON SCHEMA fencelock TO %[1]s;
		GRANT SELECT ON ALL TABLES IN SCHEMA fencelock TO %[1]s`)
	h := newHandler(t, reader)
	t.Cleanup(h.Close) // before the role's pool closes and the role is dropped: registered later, runs first
	base := serve(t, h)

	hold(t, b, "w", "ro:1")
	_, err := fencetest.NewSemaphore(t, b.Pool, "w", "sem:ro", 3).TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)
	for _, p := range []string{"leases", "semaphores", "advisory", "elections", "jobs", "fences", "ratelimits"} {
		s := events(t, b.Ctx, base, p, "")
		data := awaitEvent(t, s, 10*time.Second, "a first update", contains("database clock"))
		require.NotContains(t, data, "last poll failed", p)
	}
	data := awaitEvent(t, events(t, b.Ctx, base, "semaphores", ""), 10*time.Second, "the permit", contains("sem:ro"))
	require.Contains(t, data, "1 of 3 permits held")

	var denied error
	_, denied = reader.Exec(b.Ctx, `UPDATE fencelock.leases SET holder = 'x'`)
	require.Error(t, denied, "the role can only read")
	require.True(t, strings.Contains(denied.Error(), "permission denied"), denied)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := testkit.UnreachablePool(t)
	for _, tc := range []struct {
		arg string
		opt ui.Option
	}{
		{"WithInterval", ui.WithInterval(time.Millisecond)},
		{"WithInterval", ui.WithInterval(time.Hour)},
		{"WithWindow", ui.WithWindow(time.Second)},
		{"WithMaxRows", ui.WithMaxRows(0)},
		{"WithLogger", ui.WithLogger(nil)},
		{"WithForcedRelease", ui.WithForcedRelease(nil, ui.SecretAuthorizer(secret))},
		{"WithForcedRelease", ui.WithForcedRelease(pool, nil)},
		{"option", nil},
	} {
		_, err := ui.New(pool, tc.opt)
		fencetest.RequireArgError(t, err, tc.arg)
	}
	_, err := ui.New(nil)
	fencetest.RequireArgError(t, err, "reader")
	require.Panics(t, func() { ui.SecretAuthorizer("short") })
	require.True(t, errors.Is(func() error { _, err := ui.New(nil); return err }(), fencelock.ErrInvalidArgument))
}
