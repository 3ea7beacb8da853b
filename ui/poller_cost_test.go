package ui_test

// The poller's cost on the database: one statement per poll, none without a page; Close.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/ui"
)

func countingReader(t *testing.T, b *bundle) (*pgxpool.Pool, *countingTracer) {
	tr := &countingTracer{}
	return testkit.NewPool(t, b.Ctx, b.DB.URL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr }), tr
}

// TestNoSQLBeforeAPageOpens: "No SQL runs until a page opens (or at once, WithPollAlways)":
// over ten intervals with no page, not one statement; the first page gets its poll.
func TestNoSQLBeforeAPageOpens(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	reader, tr := countingReader(t, b)
	h := newHandler(t, reader)
	base := serve(t, h)
	time.Sleep(10 * 100 * time.Millisecond) // a stretch of no event: nothing to await
	require.Zero(t, tr.n.Load(), "statements on the reader with no page ever opened")
	awaitEvent(t, events(t, b.Ctx, base, "leases", ""), 10*time.Second, "the first page's first poll", contains("database clock"))
	require.Positive(t, tr.n.Load())
}

// TestNoPollAfterTheLastPageLeaves: once the last page leaves, polling stops (at most the poll in
// flight).
func TestNoPollAfterTheLastPageLeaves(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	reader, tr := countingReader(t, b)
	// The stream's request ending on the server side is the event the page's leaving is
	// counted from (the handler counts the page gone before its ServeHTTP returns).
	h := newHandler(t, reader)
	streamEnded := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.URL.Path == "/events" {
			streamEnded <- struct{}{}
		}
	}))
	t.Cleanup(func() { h.Close(); srv.Close() })
	base := srv.URL + "/"
	ctx, cancel := context.WithCancel(b.Ctx)
	s := events(t, ctx, base, "leases", "")
	first := pollOf(t, awaitEvent(t, s, 10*time.Second, "a first poll", contains("database clock")))
	awaitEvent(t, s, 10*time.Second, "three polls", func(d string) bool { return pollOf(t, d) >= first+3 })
	cancel()
	for range s { // the stream ended: the page left
	}
	testkit.Receive(t, streamEnded, 10*time.Second, "the stream's request to end on the server")
	// The handler counts the page gone once its stream's request ends; then at most the poll
	// in flight and the one after it (which the page's interest already scheduled) may run,
	// each one statement (TestOnePollFeedsEveryPage), however late a loaded machine runs them.
	// A poller that kept going would send one every interval: forty over these forty
	// intervals, and more than two on any machine that runs it at all.
	nLeft := tr.n.Load()
	time.Sleep(40 * 100 * time.Millisecond) // forty intervals with no page: nothing to await
	require.LessOrEqual(t, tr.n.Load()-nLeft, int64(2), "statements with no page open, beyond the poll in flight and the one it scheduled")
}

// TestPageOfIdlePollerAnswers: 30 concurrent page GETs on an idle poller all answer promptly, with
// the lease held.
func TestPageOfIdlePollerAnswers(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	hold(t, b, "idle-holder", "idle:1")
	h, err := ui.New(b.Pool, ui.WithInterval(time.Minute))
	require.NoError(t, err)
	base := serve(t, h)
	get(t, b.Ctx, base) // first poll
	var wg sync.WaitGroup
	start := time.Now()
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.Contains(t, get(t, b.Ctx, base+"name?n=idle:1"), "idle-holder")
		}()
	}
	wg.Wait()
	// One poll answers them all (the interval is a minute): well under the poll's 10 s bound.
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestPageBeforeTheFirstSnapshot: while the database does not answer the first poll (a lock
// on fencelock.leases), a page says it has no snapshot yet, never "No lease held.".
func TestPageBeforeTheFirstSnapshot(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	hold(t, b, "real-holder", "slow:1")
	tx, err := b.Pool.Begin(b.Ctx)
	require.NoError(t, err)
	defer tx.Rollback(context.WithoutCancel(b.Ctx)) //nolint:errcheck // after Rollback, a no-op
	_, err = tx.Exec(b.Ctx, `LOCK TABLE fencelock.leases IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	base := serve(t, newHandler(t, b.Pool))
	page := get(t, b.Ctx, base) // waits for the poll at most its 10 s, then renders what it has
	require.Contains(t, page, "Waiting for the first answer from the database.")
	require.NotContains(t, page, "No lease held")
	require.NoError(t, tx.Rollback(b.Ctx))
	awaitEvent(t, events(t, b.Ctx, base, "leases", ""), 15*time.Second, "the holder once the lock is gone", contains("real-holder"))
}

// TestCloseEndsStreamsAndGoroutines: Close ends every event stream at once, later requests get
// 503, no goroutine of the view is left, and a page GET in flight during Close returns.
//
// Not parallel: it runs while the package's parallel tests wait, so any goroutine of the view
// left is this handler's.
func TestCloseEndsStreamsAndGoroutines(t *testing.T) {
	b := testkit.Setup(t)
	h := newHandler(t, b.Pool)
	srv := httptest.NewServer(h)
	defer srv.Close()
	base := srv.URL + "/"
	streams := make([]<-chan string, 5)
	for i := range streams {
		streams[i] = events(t, b.Ctx, base, "leases", "")
		awaitEvent(t, streams[i], 10*time.Second, "a first update", contains("database clock"))
	}
	h.Close()
	for _, s := range streams {
		done := testkit.Async(func() bool {
			for range s {
			}
			return true
		})
		testkit.Receive(t, done, 5*time.Second, "a stream's end")
	}
	resp, err := http.Get(base)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	h.Close() // twice
	left := func() []string {
		buf := make([]byte, 1<<20)
		var out []string
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "internal/liveview.") || strings.Contains(g, "fencelock/ui.(*Handler)") {
				out = append(out, g)
			}
		}
		return out
	}
	testkit.WaitFor(t, b.Ctx, "no goroutine of the closed handler", func() bool { return len(left()) == 0 })
}

// TestStreamOutlivesWriteTimeout: mounted in a server with a WriteTimeout, a page's event
// stream goes on past it.
func TestStreamOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	h := newHandler(t, b.Pool)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.WriteTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(func() { h.Close(); srv.Close() })
	s := events(t, b.Ctx, srv.URL+"/", "leases", "")
	first := pollOf(t, awaitEvent(t, s, 10*time.Second, "a first update", contains("database clock")))
	// Ten intervals of 100 ms: three times the write timeout, on the same stream.
	awaitEvent(t, s, 10*time.Second, "an update past the write timeout", func(d string) bool { return pollOf(t, d) >= first+10 })
}
