package ui_test

// The forced-release door under attack: each refused request changes nothing and says why
// (first written as an adversarial review's reproductions).

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/ui"
)

// doorOpen serves a writable view on b and returns its base URL and good headers.
func doorOpen(t *testing.T, b *bundle, opts ...ui.Option) (string, http.Header) {
	t.Helper()
	return doorOn(t, b, b.Pool, opts...)
}

// doorOn serves a view on b whose forced release writes through writer, and returns its base
// URL and good headers: the page's CSRF token, the secret, a same-origin request.
func doorOn(t *testing.T, b *bundle, writer *pgxpool.Pool, opts ...ui.Option) (string, http.Header) {
	t.Helper()
	base := serve(t, newHandler(t, b.Pool, append([]ui.Option{ui.WithForcedRelease(writer, ui.SecretAuthorizer(secret))}, opts...)...))
	m := csrfMeta.FindStringSubmatch(get(t, b.Ctx, base))
	require.NotNil(t, m, "the page carries its CSRF token")
	return base, http.Header{"X-Fencelock-Csrf": {m[1]}, "Authorization": {"Bearer " + secret}, "Sec-Fetch-Site": {"same-origin"}}
}

// rawRelease sends method to u with body and headers h (as a form), and returns the status
// and body of the response.
func rawRelease(t *testing.T, ctx context.Context, method, u string, h http.Header, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	require.NoError(t, err)
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

type dbState struct {
	Leases   []string
	Fences   []string
	Seq      int64
	Waiters  []string
	TokenSeq int64
}

// rvSnapshot reads everything a forced release could change.
func readState(t *testing.T, ctx context.Context, b *bundle) dbState {
	t.Helper()
	var s dbState
	rows, err := b.Pool.Query(ctx, `SELECT name||'|'||holder||'|'||token||'|'||expires_at FROM fencelock.leases ORDER BY name`)
	require.NoError(t, err)
	s.Leases, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = b.Pool.Query(ctx, `SELECT resource||'|'||token FROM fencelock.fences ORDER BY resource`)
	require.NoError(t, err)
	s.Fences, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	rows, err = b.Pool.Query(ctx, `SELECT name||'|'||holder||'|'||granted_token FROM fencelock.lease_waiters ORDER BY name, seq`)
	require.NoError(t, err)
	s.Waiters, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT last_value FROM fencelock.leases_token_seq`).Scan(&s.TokenSeq))
	return s
}

// TestReleaseRefusesBadInputBeforeSQL: GET, huge body, NUL bytes, 2000-byte names, odd tokens: each a 400
// (or 405) before any SQL, and nothing changes.
func TestReleaseRefusesBadInputBeforeSQL(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	tok := fmt.Sprint(int64(hold(t, b, "worker-1", "door:1").Token()))
	tr := &countingTracer{}
	writer := testkit.NewPool(t, b.Ctx, b.DB.URL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tr })
	base, good := doorOn(t, b, writer)
	before := readState(t, b.Ctx, b)

	form := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	long := strings.Repeat("x", 2000)
	for _, tc := range []struct {
		name, method, body string
		code               int
	}{
		{"GET", http.MethodGet, "", http.StatusMethodNotAllowed},
		{"PUT", http.MethodPut, form("name", "door:1", "holder", "worker-1", "token", tok), http.StatusMethodNotAllowed},
		{"HugeBody", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", tok, "pad", strings.Repeat("a", 1<<20)), http.StatusBadRequest},
		{"NULInName", http.MethodPost, form("name", "door:1\x00", "holder", "worker-1", "token", tok), http.StatusBadRequest},
		{"NULInHolder", http.MethodPost, form("name", "door:1", "holder", "worker-1\x00", "token", tok), http.StatusBadRequest},
		{"NULInFence", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", tok, "fence", "a\x00b"), http.StatusBadRequest},
		{"LongName", http.MethodPost, form("name", long, "holder", "worker-1", "token", tok), http.StatusBadRequest},
		{"LongHolder", http.MethodPost, form("name", "door:1", "holder", long, "token", tok), http.StatusBadRequest},
		{"LongFence", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", tok, "fence", long), http.StatusBadRequest},
		{"BadUTF8", http.MethodPost, form("name", "door:1\xff", "holder", "worker-1", "token", tok), http.StatusBadRequest},
		{"EmptyFence", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", tok, "fence", ""), http.StatusBadRequest},
		{"NegToken", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", "-5"), http.StatusBadRequest},
		{"HugeToken", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", "99999999999999999999999"), http.StatusBadRequest},
		{"HexToken", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", "0x10"), http.StatusBadRequest},
		{"SpaceToken", http.MethodPost, form("name", "door:1", "holder", "worker-1", "token", " "+tok), http.StatusBadRequest},
		{"NoName", http.MethodPost, form("holder", "worker-1", "token", tok), http.StatusBadRequest},
		{"BadPercent", http.MethodPost, "name=%zz&holder=worker-1&token=" + tok, http.StatusBadRequest},
	} {
		n0 := tr.n.Load()
		code, msg := rawRelease(t, b.Ctx, tc.method, base+"release", good, strings.NewReader(tc.body))
		require.Equal(t, tc.code, code, "%s: %s", tc.name, msg)
		require.Equal(t, n0, tr.n.Load(), "%s sent SQL on the writer", tc.name)
		t.Logf("%s: %d %s", tc.name, code, strings.TrimSpace(msg))
	}
	// Name only in the URL's query, not the body: must not be taken.
	code, msg := rawRelease(t, b.Ctx, http.MethodPost, base+"release?name=door:1&holder=worker-1&token="+tok, good, strings.NewReader(""))
	require.Equal(t, http.StatusBadRequest, code, msg)
	require.Equal(t, before, readState(t, b.Ctx, b))
}

// TestReleaseOfNoGrantChangesNothing: a name never granted, and a forced mark's token: 409, no lease
// row created, no fence raised.
func TestReleaseOfNoGrantChangesNothing(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	before := readState(t, b.Ctx, b)
	code, msg := releaseForm(t, b.Ctx, base, good, "never:granted", "ghost", 5, "ledger:x")
	require.Equal(t, http.StatusConflict, code, msg)
	require.Equal(t, before, readState(t, b.Ctx, b), "nothing changed")

	// A forced mark (row held by 'fencelock force-release') named by its token and holder.
	l := hold(t, b, "w", "marked:1")
	var newTok int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT new_token FROM fencelock.force_release('marked:1', '{}', $1)`, int64(l.Token())).Scan(&newTok))
	before = readState(t, b.Ctx, b)
	code, msg = releaseForm(t, b.Ctx, base, good, "marked:1", "fencelock force-release", newTok)
	require.Equal(t, http.StatusConflict, code, msg)
	require.Equal(t, before, readState(t, b.Ctx, b), "nothing changed")
	t.Log(msg)
}

// TestReleaseOfLapsedGrantFencesIt: the token of a grant that lapsed (no heartbeat, TTL 1 s)
// and nobody took over: as with fencelock release --force --token, the release fences it out
// and says it had lapsed.
func TestReleaseOfLapsedGrantFencesIt(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	fencetest.CreateWrites(t, b.Ctx, b.Pool)
	base, good := doorOpen(t, b)
	l, err := fencetest.NewLessor(t, b.Pool, "sleepy", fencelock.WithoutHeartbeat()).TryAcquire(b.Ctx, "lapsed:1", time.Second)
	require.NoError(t, err)
	testkit.WaitFor(t, b.Ctx, "the grant to lapse", func() bool {
		var lapsed bool
		require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT expires_at <= clock_timestamp() FROM fencelock.leases WHERE name = 'lapsed:1'`).Scan(&lapsed))
		return lapsed
	})
	code, msg := releaseForm(t, b.Ctx, base, good, "lapsed:1", "sleepy", int64(l.Token()))
	require.Equal(t, http.StatusOK, code, msg)
	require.Contains(t, msg, "had lapsed")
	var stale *fencelock.StaleTokenError
	require.ErrorAs(t, fencetest.FencedWrite(b.Ctx, b.Pool, "lapsed:1", l.Token()), &stale)
}

// TestReleaseOfWrongHolderChangesNothing: the right token with the wrong holder while a waiter
// queues: 409, waiter not granted, nothing changed (token sequence included).
func TestReleaseOfWrongHolderChangesNothing(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	l := hold(t, b, "worker-1", "wh:1")
	ctx, cancel := context.WithCancel(b.Ctx)
	defer cancel()
	go func() { _, _ = fencetest.NewLessor(t, b.Pool, "worker-2").Acquire(ctx, "wh:1", time.Minute) }()
	testkit.AwaitWaiters(t, b.Ctx, b.Pool, "wh:1", 1)
	before := readState(t, b.Ctx, b)
	code, msg := releaseForm(t, b.Ctx, base, good, "wh:1", "worker-2", int64(l.Token()), "ledger:wh")
	require.Equal(t, http.StatusConflict, code, msg)
	after := readState(t, b.Ctx, b)
	require.Equal(t, before.Leases, after.Leases)
	require.Equal(t, before.Fences, after.Fences)
	require.Equal(t, before.Waiters, after.Waiters)
	require.Equal(t, before.TokenSeq, after.TokenSeq, "the refused release drew a token (it checks the grant before force_release)")
}

// TestReleaseSentTwiceEndsOneGrant: the same release sent 8 times at once: one 200, the rest 409,
// one new token.
func TestReleaseSentTwiceEndsOneGrant(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	l := hold(t, b, "worker-1", "dbl:1")
	var wg sync.WaitGroup
	codes := make([]int, 8)
	msgs := make([]string, 8)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], msgs[i] = releaseForm(t, b.Ctx, base, good, "dbl:1", "worker-1", int64(l.Token()))
		}()
	}
	wg.Wait()
	ok := 0
	for i, c := range codes {
		if c == http.StatusOK {
			ok++
		} else {
			require.Equal(t, http.StatusConflict, c, msgs[i])
		}
	}
	require.Equal(t, 1, ok, "%v %q", codes, msgs)
}

// TestReleaseGivesUpOnGuardedTransaction: the holder sits in a guarded transaction (and, second case, a
// FenceTx on a resource given as fence): the release gives up after about 5 s with a 409
// and changes nothing.
func TestReleaseGivesUpOnGuardedTransaction(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	fencetest.CreateWrites(t, b.Ctx, b.Pool)
	base, good := doorOpen(t, b)
	l := hold(t, b, "worker-1", "guard:1")

	for _, mode := range []string{"GuardTx", "FenceTxOtherResource"} {
		tx, err := b.Pool.Begin(b.Ctx)
		require.NoError(t, err)
		if mode == "GuardTx" {
			require.NoError(t, l.GuardTx(b.Ctx, tx))
		} else {
			require.NoError(t, l.FenceTx(b.Ctx, tx, "ledger:guard"))
		}
		before := readState(t, b.Ctx, b)
		start := time.Now()
		code, msg := releaseForm(t, b.Ctx, base, good, "guard:1", "worker-1", int64(l.Token()), "ledger:guard")
		took := time.Since(start)
		t.Logf("%s: %d after %v: %s", mode, code, took, msg)
		require.Equal(t, http.StatusConflict, code, msg)
		require.GreaterOrEqual(t, took, 4900*time.Millisecond, "it waits out its lock timeout of 5 s")
		require.NoError(t, tx.Commit(b.Ctx))
		after := readState(t, b.Ctx, b)
		require.Equal(t, before.Leases, after.Leases, mode)
		require.Equal(t, before.Fences[:0:0], after.Fences[:0:0], mode)
	}
	// After: the door works.
	code, msg := releaseForm(t, b.Ctx, base, good, "guard:1", "worker-1", int64(l.Token()))
	require.Equal(t, http.StatusOK, code, msg)
}

var dataAttr = regexp.MustCompile(`data-(name|holder)="([^"]*)"`)

// TestNamesAndHoldersEscaped: names and holders with quotes, tags, scripts, CR/LF: the page and the
// event stream carry no live markup, and the data-* attributes round-trip to the exact name
// and holder the release needs.
func TestNamesAndHoldersEscaped(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	type nh struct{ name, holder string }
	cases := []nh{
		{`x"><script>alert(1)</script>`, `h"><img src=x onerror=alert(1)>`},
		{`a' onmouseover='alert(1)`, "</title><script>alert(2)</script>"},
		{"javascript:alert(1)", "]]><svg onload=alert(3)>"},
		{"semi;colon+plus&amp=1#frag", "<!--"},
		{"crlf\r\nname", "cr\rholder"},
		{"data: evil\n\nevent: update", "lf\nholder"},
	}
	for _, c := range cases {
		_, err := fencetest.NewLessor(t, b.Pool, c.holder).TryAcquire(b.Ctx, c.name, time.Minute)
		require.NoError(t, err, "%q", c.name)
	}
	live := events(t, b.Ctx, base, "leases", "")
	ev := awaitEvent(t, live, 10*time.Second, "all leases", func(d string) bool { return strings.Count(d, "data-release") == len(cases) })
	page := get(t, b.Ctx, base) // the view the stream showed, or a later one
	for _, doc := range []string{page, ev} {
		for _, bad := range []string{"<script>alert", "<img", "<svg onload", "onmouseover='", "</title><script"} {
			require.NotContains(t, doc, bad)
		}
	}
	// data attributes decode (as a browser would: HTML entity decoding plus CR/CRLF -> LF
	// normalisation of the input stream) to the exact name/holder.
	browser := func(s string) string {
		s = strings.ReplaceAll(s, "\r\n", "\n")
		s = strings.ReplaceAll(s, "\r", "\n")
		return html.UnescapeString(s)
	}
	for label, doc := range map[string]string{"page": page, "event": ev} {
		got := map[string]bool{}
		for _, m := range dataAttr.FindAllStringSubmatch(doc, -1) {
			got[m[1]+"="+browser(m[2])] = true
		}
		for _, c := range cases {
			if !got["name="+c.name] {
				t.Errorf("(%s): data-name of %q does not round-trip", label, c.name)
			}
			if !got["holder="+c.holder] {
				t.Errorf("(%s): data-holder of %q does not round-trip", label, c.holder)
			}
		}
	}
	// The name page of each, by its link.
	for _, c := range cases {
		body := get(t, b.Ctx, base+"name?n="+url.QueryEscape(c.name))
		require.NotContains(t, body, "<script>alert")
		require.Contains(t, body, html.EscapeString(c.holder)[:2])
	}
	// A release of the CR holder as the page would send it (browser-decoded): refused.
	var tok int64
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT token FROM fencelock.leases WHERE name=$1`, "crlf\r\nname").Scan(&tok))
	// The attributes round-trip (above), so the page sends the exact name and holder.
	code, msg := releaseForm(t, b.Ctx, base, good, "crlf\r\nname", "cr\rholder", tok)
	require.Equal(t, http.StatusOK, code, "the release of a name and holder with a carriage return: %s", msg)
}

// TestReleaseRefusesOtherOrigins: a cross-origin request told apart by Origin alone (no Sec-Fetch-Site,
// as from an older browser), and a same-site sibling: refused, nothing changed.
func TestReleaseRefusesOtherOrigins(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	l := hold(t, b, "worker-1", "origin:1")
	before := readState(t, b.Ctx, b)
	for _, h := range []http.Header{
		{"Origin": {"http://evil.example"}},
		{"Sec-Fetch-Site": {"same-site"}},
		{"Sec-Fetch-Site": {"cross-site"}, "Origin": {strings.TrimSuffix(base, "/")}},
	} {
		hh := good.Clone()
		hh.Del("Sec-Fetch-Site")
		for k, v := range h {
			hh[k] = v
		}
		code, msg := releaseForm(t, b.Ctx, base, hh, "origin:1", "worker-1", int64(l.Token()))
		require.Equal(t, http.StatusForbidden, code, "%v: %s", h, msg)
	}
	require.Equal(t, before, readState(t, b.Ctx, b))
}

// TestNamePageKeepsCarriageReturns: the heading and <title> of a name page show a carriage
// return in the name as one (a character reference), as the live part does, so that "a\rb"
// and "a\nb" are told apart there too; before, the page carried the raw character, which an
// HTML parser reads as a line feed.
func TestNamePageKeepsCarriageReturns(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, _ := doorOpen(t, b)
	for _, name := range []string{"a\rb", "a\r\nb", "a\nb"} {
		body := get(t, b.Ctx, base+"name?n="+url.QueryEscape(name))
		require.NotContains(t, body, "\r", "%q: a raw carriage return", name)
		want := strings.ReplaceAll(name, "\r", "&#13;")
		require.Contains(t, body, "<title>fencelock · Lease "+want+"</title>", "%q", name)
		require.Contains(t, body, "<h1>Lease "+want+"</h1>", "%q", name)
	}
}

// TestReleaseOfPermitGoesToHead: the page's forced release of a semaphore's permit ("S#0")
// gives it to the head of the semaphore's queue, and its answer names that waiter (migration
// 00018; before, the permit went to nobody and the answer named nobody). The head's own
// attempt, running at that instant, makes the release free the permit and wake the head
// instead: the answer then says so.
func TestReleaseOfPermitGoesToHead(t *testing.T) {
	t.Parallel()
	b := testkit.Setup(t)
	base, good := doorOpen(t, b)
	hs, err := fencelock.NewSemaphore(fencetest.NewLessor(t, b.Pool, "worker-1"), "door-sem", 1)
	require.NoError(t, err)
	ws, err := fencelock.NewSemaphore(fencetest.NewLessor(t, b.Pool, "worker-2"), "door-sem", 1)
	require.NoError(t, err)
	permit, err := hs.TryAcquire(b.Ctx, time.Minute)
	require.NoError(t, err)
	got := fencetest.PermitAsync(b.Ctx, ws, 10*time.Second)
	testkit.AwaitPermitWaiters(t, b.Ctx, b.Pool, "door-sem", "worker-2")
	code, msg := releaseForm(t, b.Ctx, base, good, "door-sem#0", "worker-1", int64(permit.Token()))
	require.Equal(t, http.StatusOK, code, msg)
	require.Regexp(t, `; (handed to worker-2|freed, and the head of the queue, worker-2, woken to take it)$`, msg)
	g := fencetest.Receive(t, got, 10*time.Second)
	require.NoError(t, g.Err)
	require.Greater(t, g.Lease.Token(), permit.Token())
	require.NoError(t, g.Lease.Release(b.Ctx))
}
