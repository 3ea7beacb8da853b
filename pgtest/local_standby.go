//go:build unix

package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// replicationHBA is the pg_hba.conf line that lets pg_basebackup and a standby's WAL receiver
// connect to a local server for replication.
const replicationHBA = "host replication all 127.0.0.1/32 trust"

// allowReplication makes sure the pg_hba.conf at path (of the pristine cluster) accepts
// replication connections from 127.0.0.1 with trust authentication. initdb -A trust writes
// such a line itself (PostgreSQL 10 and later); if it is missing, allowReplication appends
// replicationHBA. An earlier line cannot shadow it: "all" in the database column does not
// match replication connections.
func allowReplication(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("pgtest: pg_hba.conf: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == "host" && f[1] == "replication" && (f[2] == "all" || f[2] == "postgres") &&
			f[3] == "127.0.0.1/32" && f[4] == "trust" {
			return nil
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: pg_hba.conf: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# added by pgtest for StartStandby\n%s\n", replicationHBA)
	if err := errors.Join(err, f.Close()); err != nil {
		return fmt.Errorf("pgtest: pg_hba.conf: %w", err)
	}
	return nil
}

// startStandby takes a base backup of the running server l, whose postgres database is at
// primary, into a fresh temp dir with pg_basebackup (standby.signal and primary_conninfo
// written by -R), then starts a postmaster on it with l's settings on a free port. It returns
// the standby and the URL of its postgres database.
func (l *localServer) startStandby(ctx context.Context, primary *url.URL) (*localServer, *url.URL, error) {
	basebackup := filepath.Join(l.bins.dir, "pg_basebackup")
	if !isExecutable(basebackup) {
		var err error
		if basebackup, err = exec.LookPath("pg_basebackup"); err != nil {
			return nil, nil, fmt.Errorf("pgtest: start standby: pg_basebackup is neither in %s nor on PATH", l.bins.dir)
		}
	}
	sl := &localServer{bins: l.bins, cred: l.cred, flags: l.flags, archiveDir: l.archiveDir}
	var err error
	if sl.dir, err = os.MkdirTemp("", "pgtest-standby-*"); err != nil {
		return nil, nil, fmt.Errorf("pgtest: start standby: %w", err)
	}
	fail := func(err error) (*localServer, *url.URL, error) {
		os.RemoveAll(sl.dir)
		return nil, nil, err
	}
	if err := chownTo(sl.dir, sl.cred); err != nil {
		return fail(fmt.Errorf("pgtest: start standby: %w", err))
	}
	data := filepath.Join(sl.dir, "data")
	cmd := command(ctx, sl.cred, sl.dir, basebackup,
		"-D", data, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync", "--no-password",
		"-h", primary.Hostname(), "-p", primary.Port(), "-U", primary.User.Username())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("pgtest: start standby: %s: %w\n%s", basebackup, err, bytes.TrimSpace(out)))
	}
	base, err := sl.startOnFreePort(ctx, data)
	if err != nil {
		return fail(fmt.Errorf("pgtest: start standby: %w", err))
	}
	return sl, base, nil
}
