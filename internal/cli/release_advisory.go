package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/fencelock/fencelock"
)

// terminateWait bounds the wait for a terminated backend to exit (and so to release its locks).
const terminateWait = 5 * time.Second

// advisoryArg is the lock of release --advisory: an int64 key, a pair of int32 keys, or a
// name, hashed to its int64 key as an [fencelock.AdvisoryLocker] of the namespace does. Holders
// are found by key alone: the name column of fencelock.advisory_locks carries no namespace (and
// is cut to 53 bytes), so matching it could end a lock of the same name in another namespace.
type advisoryArg struct {
	text   string
	name   bool // given as a name
	key    *int64
	k1, k2 *int32
}

// parseAdvisoryArg reads "123" as an int64 key, "1,2" as a pair key, anything else as a name
// in namespace (with [fencelock.SHA256KeyHash], the default key hash).
func parseAdvisoryArg(s, namespace string) (advisoryArg, error) {
	a := advisoryArg{text: s}
	if k, err := strconv.ParseInt(s, 10, 64); err == nil {
		a.key = &k
		return a, nil
	}
	if p1, p2, ok := strings.Cut(s, ","); ok {
		k1, err1 := strconv.ParseInt(strings.TrimSpace(p1), 10, 32)
		k2, err2 := strconv.ParseInt(strings.TrimSpace(p2), 10, 32)
		if err1 == nil && err2 == nil {
			a.k1, a.k2 = ptr(int32(k1)), ptr(int32(k2))
			return a, nil
		}
	}
	if namespace == "" {
		return a, fmt.Errorf("--namespace is empty")
	}
	a.name = true
	a.key = ptr(fencelock.SHA256KeyHash(namespace, s))
	return a, nil
}

// String names the lock in messages: `advisory lock "name" (key N)`, "advisory key N" or
// "advisory key K1,K2".
func (a advisoryArg) String() string {
	switch {
	case a.name:
		return fmt.Sprintf("advisory lock %q (key %d)", a.text, *a.key)
	case a.key != nil:
		return fmt.Sprintf("advisory key %d", *a.key)
	default:
		return fmt.Sprintf("advisory key %d,%d", *a.k1, *a.k2)
	}
}

// backendRow is a backend holding an advisory lock.
type backendRow struct {
	PID             int32  `json:"pid"`
	ApplicationName string `json:"application_name"`
	ClientAddr      string `json:"client_addr"`
	Mode            string `json:"mode"`
}

// label renders the backend for prompts: "backend 1234 (application_name, client_addr)".
func (b backendRow) label() string {
	var detail []string
	for _, d := range []string{b.ApplicationName, b.ClientAddr} {
		if d != "" {
			detail = append(detail, cell(d))
		}
	}
	if len(detail) == 0 {
		return fmt.Sprintf("backend %d", b.PID)
	}
	return fmt.Sprintf("backend %d (%s)", b.PID, strings.Join(detail, ", "))
}

// advisoryResult is the outcome of release --force --advisory, and its --json object.
type advisoryResult struct {
	Lock       string       `json:"lock"`
	Key        *int64       `json:"key,omitempty"`
	Key1       *int32       `json:"key1,omitempty"`
	Key2       *int32       `json:"key2,omitempty"`
	Terminated []backendRow `json:"terminated"`
	Declined   []backendRow `json:"declined"`
}

// releaseAdvisory terminates the backends holding the advisory lock a, each after a y/N prompt
// on stderr read from stdin unless yes, and waits for each to exit.
func (s *session) releaseAdvisory(ctx context.Context, a advisoryArg, yes bool) error {
	pool, err := s.pool(ctx)
	if err != nil {
		return err
	}
	// A prepared transaction's locks show without a pid: no backend to terminate.
	rows, err := pool.Query(ctx, `
		SELECT DISTINCT ON (pid) pid, coalesce(application_name, ''), coalesce(host(client_addr), ''), mode
		FROM fencelock.advisory_locks
		WHERE granted AND (key = $1 OR (key1 = $2 AND key2 = $3))
		ORDER BY pid`, a.key, a.k1, a.k2)
	if err != nil {
		return dbError("read fencelock.advisory_locks", err)
	}
	var (
		holders  []backendRow
		prepared bool
	)
	for rows.Next() {
		var (
			b   backendRow
			pid *int32
		)
		if err := rows.Scan(&pid, &b.ApplicationName, &b.ClientAddr, &b.Mode); err != nil {
			rows.Close()
			return dbError("read fencelock.advisory_locks", err)
		}
		if pid == nil {
			prepared = true
			continue
		}
		b.PID = *pid
		holders = append(holders, b)
	}
	if err := rows.Err(); err != nil {
		return dbError("read fencelock.advisory_locks", err)
	}
	const preparedHint = "a prepared transaction holds %v: COMMIT PREPARED or ROLLBACK PREPARED it (see pg_prepared_xacts)"
	if len(holders) == 0 && prepared {
		return fmt.Errorf(preparedHint, a)
	}
	if len(holders) == 0 {
		return withCode(ExitNotFound, "no backend holds %v", a)
	}
	if prepared {
		fmt.Fprintf(s.stderr, "fencelock: "+preparedHint+"\n", a)
	}

	res := advisoryResult{Lock: a.text, Key: a.key, Key1: a.k1, Key2: a.k2, Terminated: []backendRow{}, Declined: []backendRow{}}
	answers := bufio.NewReader(orEmpty(s.stdin))
	for _, b := range holders {
		if !yes && !confirm(s.stderr, answers, fmt.Sprintf("terminate %s? [y/N] ", b.label())) {
			res.Declined = append(res.Declined, b)
			continue
		}
		if err := terminate(ctx, s, b.PID); err != nil {
			return err
		}
		res.Terminated = append(res.Terminated, b)
		if !s.json {
			fmt.Fprintf(s.stdout, "terminated %s, which held %v\n", b.label(), a)
		}
	}
	if s.json {
		if err := s.printJSON(res); err != nil {
			return err
		}
	}
	if len(res.Declined) > 0 {
		pids := make([]int32, len(res.Declined))
		for i, b := range res.Declined {
			pids[i] = b.PID
		}
		return withCode(ExitError, "declined: backend %s not terminated; %v is still held", joinPIDs(pids), a)
	}
	return nil
}

// confirm writes prompt to w and reads one line from r: true for "y" or "yes" in any case.
// End of input declines.
func confirm(w io.Writer, r *bufio.Reader, prompt string) bool {
	fmt.Fprint(w, prompt)
	line, err := r.ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(w)
		return false
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// terminate ends backend pid with pg_terminate_backend and waits, up to terminateWait, until
// it has exited and holds no lock. A pid that is already gone is no error.
func terminate(ctx context.Context, s *session, pid int32) error {
	pool, err := s.pool(ctx)
	if err != nil {
		return err
	}
	var signalled bool
	if err := pool.QueryRow(ctx, `SELECT pg_catalog.pg_terminate_backend($1)`, pid).Scan(&signalled); err != nil {
		return dbError(fmt.Sprintf("terminate backend %d", pid), err)
	}
	deadline := time.Now().Add(terminateWait)
	for {
		var alive bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_activity WHERE pid = $1)
			OR EXISTS (SELECT FROM pg_catalog.pg_locks WHERE pid = $1)`, pid).Scan(&alive)
		if err != nil {
			return dbError(fmt.Sprintf("wait for backend %d to exit", pid), err)
		}
		if !alive {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("backend %d was signalled but has not exited after %v", pid, terminateWait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// orEmpty returns r, or an empty reader for nil.
func orEmpty(r io.Reader) io.Reader {
	if r == nil {
		return strings.NewReader("")
	}
	return r
}
