package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit/fencetest"
	"github.com/fencelock/fencelock/pgtest"
)

// systemPython is Debian's interpreter, which python3-psycopg (psycopg 3) installs for; the
// python3 first on PATH may be another one without it.
const systemPython = "/usr/bin/python3"

// pyWorker is testdata/sql_api_worker.py running on a test's database: a lease holder that
// speaks only the SQL API (migration 00014) through psycopg, driven one command at a time.
type pyWorker struct {
	t      *testing.T
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *bytes.Buffer
}

// requirePsycopg skips the test when systemPython cannot import psycopg, unless CI=true, where
// it fails instead: CI installs python3-psycopg.
func requirePsycopg(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(systemPython, "-c", "import psycopg").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s cannot import psycopg (install Debian's python3-psycopg): %v\n%s", systemPython, err, out)
		if pgtest.InCI() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// startPyWorker starts the worker on b's database and stops it at test cleanup (before the
// database is dropped).
func startPyWorker(t *testing.T, b *bundle) *pyWorker {
	t.Helper()
	cmd := exec.CommandContext(b.Ctx, systemPython, "testdata/sql_api_worker.py", b.DB.URL)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	w := &pyWorker{t: t, in: in, out: bufio.NewScanner(out), stderr: new(bytes.Buffer)}
	cmd.Stderr = w.stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = in.Close() // EOF on stdin: the worker closes its connection and exits
		if err := cmd.Wait(); err != nil {
			t.Errorf("python worker: %v\n%s", err, w.stderr)
		}
	})
	return w
}

// pyReply is one reply of the worker: Value for "ok VALUE" ("" for a bare "ok"), or the
// SQLSTATE of "err SQLSTATE MESSAGE".
type pyReply struct {
	Value    string
	SQLState string
}

// do sends one command and returns the worker's reply, which it awaits (bounded by the test's
// context: when it ends, the worker is killed and its stdout closes).
func (w *pyWorker) do(args ...any) pyReply {
	w.t.Helper()
	_, err := fmt.Fprintln(w.in, args...)
	require.NoError(w.t, err)
	require.True(w.t, w.out.Scan(), "python worker gave no reply to %v (%v); stderr:\n%s", args, w.out.Err(), w.stderr)
	line := w.out.Text()
	switch kind, rest, _ := strings.Cut(line, " "); kind {
	case "ok":
		return pyReply{Value: rest}
	case "err":
		state, _, _ := strings.Cut(rest, " ")
		w.t.Logf("python worker: %v -> %s", args, line)
		return pyReply{SQLState: state}
	}
	w.t.Fatalf("python worker replied %q to %v", line, args)
	return pyReply{}
}

// token sends a command that must reply with a fencing token, and returns it.
func (w *pyWorker) token(args ...any) fencelock.Token {
	w.t.Helper()
	r := w.do(args...)
	require.Empty(w.t, r.SQLState, "%v", args)
	tok, err := strconv.ParseInt(r.Value, 10, 64)
	require.NoError(w.t, err, "%v replied %q", args, r.Value)
	return fencelock.Token(tok)
}

// A lease taken through the SQL API from another language and one taken by a Go lessor
// exclude each other on the same name, share one token sequence, and each side's fenced writes
// refuse the other's stale ones: Go to Python, Python to Go, and a release in SQL hands the
// lease to a Go waiter at the head of the queue.
func TestSQLAPIPythonWorker(t *testing.T) {
	t.Parallel()
	requirePsycopg(t)
	b := setup(t)
	_, err := b.Pool.Exec(b.Ctx, `CREATE TABLE writes (resource text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
	py := startPyWorker(t, b)
	g := newLessor(t, b.Pool, "go")
	const name, resource = "acct:1", "acct:1"
	goWrite := func(lease *fencelock.Lease) error {
		return pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
			if err := lease.FenceTx(b.Ctx, tx, resource); err != nil {
				return err
			}
			_, err := tx.Exec(b.Ctx, `INSERT INTO writes (resource, token) VALUES ($1, $2)`, resource, int64(lease.Token()))
			return err
		})
	}
	// The python lease that will expire has a TTL of pyTTL: the steps before its expiry are a
	// few round trips, which must end within it also on a loaded machine under -race.
	const pyTTL = 5 * time.Second
	pyTTLms := pyTTL.Milliseconds()

	// Go holds; Python is refused, then granted once Go releases.
	g0, err := g.TryAcquire(b.Ctx, name, time.Minute)
	require.NoError(t, err)
	require.Equal(t, pyReply{Value: "null"}, py.do("try", name, "py", 60000))
	require.NoError(t, g0.Release(b.Ctx))
	t1 := py.token("try", name, "py", pyTTLms)
	require.Greater(t, t1, g0.Token())
	require.Equal(t, pyReply{}, py.do("fence_lease", name, "py", t1, resource))
	_, err = g.TryAcquire(b.Ctx, name, time.Minute)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired, "Go was granted the lease Python holds")

	// Python's lease runs out; Go takes over and fences Python out.
	waitFor(t, b, "python's lease expired", func() bool { return readLease(t, b.Ctx, b.Pool, name).Expired })
	g2, err := g.TryAcquire(b.Ctx, name, time.Minute)
	require.NoError(t, err)
	require.Greater(t, g2.Token(), t1)
	require.NoError(t, goWrite(g2))
	require.Equal(t, pyReply{SQLState: "FL005"}, py.do("fence_lease", name, "py", t1, resource), "stale lease")
	require.Equal(t, pyReply{SQLState: "FL004"}, py.do("fence", resource, t1), "stale token")
	require.Equal(t, pyReply{SQLState: "FL005"}, py.do("renew", name, "py", t1, 60000), "late renewal")

	// The other way: Go's grant is taken away on the server (as an operator's force_release
	// does) while Go still trusts it; Python is granted and fences Go out.
	_, err = b.Pool.Exec(b.Ctx, `SELECT fencelock.force_release($1, ARRAY[]::text[])`, name)
	require.NoError(t, err)
	t3 := py.token("try", name, "py", 60000)
	require.Greater(t, t3, g2.Token())
	require.Equal(t, pyReply{}, py.do("fence_lease", name, "py", t3, resource))
	var lost *fencelock.LeaseLostError
	require.ErrorAs(t, goWrite(g2), &lost)
	require.Equal(t, g2.Token(), lost.Token)
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, resource, g2.Token()) })
	require.Equal(t, &fencelock.StaleTokenError{Resource: resource, Token: g2.Token(), Current: t3}, errorsAsStale(t, err))

	// A Go lessor waiting in the queue is handed the lease by Python's release in SQL, in the
	// release's own transaction: the row names the Go waiter as soon as the release returns.
	waiter := newLessor(t, b.Pool, "go-waiter")
	got := fencetest.AcquireAsync(b.Ctx, waiter, name, time.Minute)
	awaitWaiters(t, b, name, 1)
	require.Equal(t, pyReply{Value: "true"}, py.do("release", name, "py", t3))
	row := readLease(t, b.Ctx, b.Pool, name)
	require.Equal(t, "go-waiter", row.Holder, "python's release did not hand the lease to the waiter")
	require.Greater(t, row.Token, int64(t3))
	a := fencetest.Receive(t, got, 10*time.Second)
	require.NoError(t, a.Err)
	require.Equal(t, fencelock.Token(row.Token), a.Lease.Token())
	require.NoError(t, a.Lease.Release(b.Ctx))

	require.Equal(t, []int64{int64(t1), int64(g2.Token()), int64(t3)}, writtenTokens(t, b, resource),
		"only the current holders' writes landed")
}

// errorsAsStale returns the *fencelock.StaleTokenError in err, failing the test unless there is
// one and err matches fencelock.ErrStaleToken.
var errorsAsStale = fencetest.ErrorsAsStale
