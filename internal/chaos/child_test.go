package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// childConfig configures a holder child process: it takes lease Name for TTL on the database
// at URL as Worker, then appends to the ledger of Name every Interval, whatever its Done
// says (a holder with a write in flight), until told to stop on stdin. Each append follows
// the holder's own check (see checkHeld). With Interval 0 it appends only when told to (see
// child.write).
type childConfig struct {
	URL      string
	Worker   string
	Name     string
	TTL      time.Duration
	Interval time.Duration
	Election bool // campaign in the election Name (a term is a lease of it) instead of Acquire
}

// childEvent is one line a child writes on stdout: an operation recorded by its recorder.
type childEvent struct {
	Ev   string // "invoke", "complete" or "record"
	Op   Op
	Wall time.Time
}

// runChild is the holder child process (see TestMain); it returns the exit code.
func runChild(cfgJSON string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cfg.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	rec := NewRecorder(0)
	var outMu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	rec.Sink = func(ev string, op Op) {
		outMu.Lock()
		defer outMu.Unlock()
		wall := rec.Wall(op.Invoke)
		if ev == "complete" {
			wall = rec.Wall(op.Return)
		}
		_ = enc.Encode(childEvent{ev, op, wall})
	}
	l, err := fencelock.NewLessor(pool, fencelock.WithHolder(cfg.Worker), backoffUpTo(20*time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var lease *fencelock.Lease
	if cfg.Election {
		e, err := fencelock.NewElection(l, cfg.Name, cfg.TTL)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		var ok bool
		if lease, ok = campaignRecorded(ctx, rec, e, cfg.Worker); !ok {
			return 2
		}
	} else {
		id := rec.Invoke(Op{Worker: cfg.Worker, Kind: KindGrant, Name: cfg.Name, Holder: cfg.Worker})
		lease, err = l.Acquire(ctx, cfg.Name, cfg.TTL)
		if err != nil {
			rec.Complete(id, Fail, err, nil)
			return 2
		}
		rec.Complete(id, OK, nil, func(op *Op) { op.Token, op.Expires = int64(lease.Token()), lease.ExpiresAt() })
	}
	doneRecorded := make(chan struct{})
	go func() {
		defer close(doneRecorded)
		late := AwaitClosing(lease.Done(), lease.TrustedUntil)
		rec.Record(Op{Worker: cfg.Worker, Kind: KindDone, Name: cfg.Name, Token: int64(lease.Token()), Expires: lease.ExpiresAt(), Err: fmt.Sprint(lease.Err()), Late: late})
	}()

	// stdin: a line "write" asks for one more check and append now; "stop" or EOF ends the child.
	writes, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stop)
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() && in.Text() == "write" {
			writes <- struct{}{}
		}
	}()
	app := &Appender{Pool: pool, Rec: rec, Worker: cfg.Worker, Holder: cfg.Worker}
	write := func() {
		checkHeld(rec, cfg.Worker, lease)
		_ = app.Append(ctx, cfg.Name, lease.Token())
	}
	var tick <-chan time.Time // nil, so never ready, when Interval is 0
	if cfg.Interval > 0 {
		write()
	}
	for {
		if cfg.Interval > 0 {
			tick = time.After(cfg.Interval)
		}
		select {
		case <-stop:
			_ = lease.Release(ctx)
			<-doneRecorded // Release has closed Done: its record goes out before the exit
			return 0
		case <-writes:
			write()
		case <-tick:
			write()
		}
	}
}

// checkHeld makes the holder's own validity check, Err() == nil, and records it (as OK when
// the lease was trusted) with the time read before the check.
func checkHeld(rec *Recorder, worker string, lease *fencelock.Lease) bool {
	now := rec.Now()
	held := lease.Err() == nil
	outcome := Fail
	if held {
		outcome = OK
	}
	rec.Record(Op{Worker: worker, Kind: KindCheck, Name: lease.Name(), Token: int64(lease.Token()), Outcome: outcome, Expires: lease.ExpiresAt(), Invoke: now, Return: max(rec.Now(), now+1)})
	return held
}

// child is the test's handle on a holder child process.
type child struct {
	t       *testing.T
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	granted chan Op
	exited  chan struct{} // closed once the child has exited and its output is imported
	waitErr error         // the child's exit error (nil: exit status 0), set before exited closes
}

// startChild starts a holder child with cfg, importing its history into rec.
func startChild(t *testing.T, cfg childConfig, rec *Recorder) *child {
	t.Helper()
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	stdin, stdout := testkit.StartPiped(t, cmd)
	c := &child{t: t, cmd: cmd, stdin: stdin, granted: make(chan Op, 1), exited: make(chan struct{})}
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.exited })
	go func() {
		defer close(c.exited)
		ids := map[int]int{} // child op id -> rec id
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var ev childEvent
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				continue
			}
			switch ev.Ev {
			case "invoke":
				ids[ev.Op.ID] = rec.InvokeAt(ev.Op, ev.Wall)
			case "complete":
				id := ids[ev.Op.ID]
				rec.CompleteAt(id, ev.Op, ev.Wall)
				if ev.Op.Kind == KindGrant && ev.Op.Outcome == OK {
					c.granted <- ev.Op
				}
			case "record":
				id := rec.InvokeAt(ev.Op, ev.Wall)
				rec.CompleteAt(id, ev.Op, ev.Wall.Add(ev.Op.Return-ev.Op.Invoke))
			}
		}
		c.waitErr = cmd.Wait()
	}()
	return c
}

// waitGrant waits for the child's grant and returns it.
func (c *child) waitGrant(ctx context.Context) Op {
	c.t.Helper()
	select {
	case op := <-c.granted:
		return op
	case <-c.exited:
		c.t.Fatal("child exited before its grant")
	case <-ctx.Done():
		c.t.Fatal("child not granted in time")
	}
	return Op{}
}

// signal sends sig to the child.
func (c *child) signal(sig syscall.Signal) { require.NoError(c.t, c.cmd.Process.Signal(sig)) }

// write tells the child to make one more check and fenced append now (at once if it is
// running, on resuming if it is stopped); both are recorded in its history.
func (c *child) write() {
	_, err := io.WriteString(c.stdin, "write\n")
	require.NoError(c.t, err)
}

// finish tells the child to stop, waits for it to exit (at most limit, then kills it) and
// returns its exit error: nil when it released its lease and exited with status 0.
func (c *child) finish(limit time.Duration) error {
	_ = c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(limit):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
	return c.waitErr
}

// kill sends SIGKILL and waits until the child has exited and its output is imported.
func (c *child) kill() {
	c.signal(syscall.SIGKILL)
	<-c.exited
}
