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
	"syscall"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// debianPgBouncer is where Debian's pgbouncer package puts the binary, off a non-root PATH.
const debianPgBouncer = "/usr/sbin/pgbouncer"

// findPgBouncer returns the path of the pgbouncer binary: on PATH, else debianPgBouncer.
func findPgBouncer() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	if pgserver.IsExecutable(debianPgBouncer) {
		return debianPgBouncer, nil
	}
	return "", fmt.Errorf("pgtest: pgbouncer not found on PATH nor at %s: install it (Debian, Ubuntu: apt-get install pgbouncer)", debianPgBouncer)
}

// launchPgBouncer writes the config of a PgBouncer in front of target into a fresh temp dir,
// starts bin on a free port (another one if the port is taken before PgBouncer binds it) and
// waits until a connection through it to database checkDB succeeds.
func launchPgBouncer(ctx context.Context, bin, target, poolMode, checkDB string) (*PgBouncer, error) {
	cred, err := pgserver.RunAsCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-pgbouncer-*")
	if err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	fail := func(err error) (*PgBouncer, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := pgserver.ChownTo(dir, cred); err != nil {
		return fail(fmt.Errorf("pgtest: pgbouncer: %w", err))
	}
	out, err := pgserver.Command(ctx, cred, dir, bin, "--version").CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("pgtest: %s --version: %w\n%s", bin, err, bytes.TrimSpace(out)))
	}
	version, prepared := parsePgBouncerVersion(string(out))
	if err := writeOwned(filepath.Join(dir, "userlist.txt"), pgbouncerUserlist, cred); err != nil {
		return fail(err)
	}
	for attempt := 1; ; attempt++ {
		port, err := pgserver.FreePort()
		if err != nil {
			return fail(err)
		}
		p := &PgBouncer{
			base:     pgserver.LoopbackURL("127.0.0.1", port, url.User("postgres")),
			version:  version,
			prepared: prepared,
			dir:      dir,
		}
		ini := filepath.Join(dir, "pgbouncer.ini")
		if err := writeOwned(ini, pgbouncerConfig(dir, port, target, poolMode, prepared), cred); err != nil {
			return fail(err)
		}
		err = p.start(ctx, cred, bin, ini, checkDB)
		if err == nil {
			return p, nil
		}
		if attempt == pgserver.PortAttempts || !strings.Contains(err.Error(), "Address already in use") {
			return fail(err)
		}
		// Start the next attempt's logs afresh.
		_ = os.Remove(filepath.Join(dir, "pgbouncer.log"))
		_ = os.Remove(filepath.Join(dir, "stderr.log"))
	}
}

// writeOwned writes text to a new file at path, readable only by its owner, cred's user.
func writeOwned(path, text string, cred *syscall.Credential) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	if err := pgserver.ChownTo(path, cred); err != nil {
		return fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	return nil
}

// start runs PgBouncer (quiet: it logs to its logfile; stderr.log catches what it writes
// before reading that setting) and waits until a connection through it succeeds; on failure
// it kills it and returns the error with the tails of its logs.
func (p *PgBouncer) start(ctx context.Context, cred *syscall.Credential, bin, ini, checkDB string) error {
	stderrPath := filepath.Join(p.dir, "stderr.log")
	stderr, err := os.OpenFile(stderrPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: pgbouncer: %w", err)
	}
	// PgBouncer outlives ctx, which only bounds the start.
	cmd := pgserver.Command(context.Background(), cred, p.dir, bin, "-q", ini)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	r, err := pgserver.StartRun(cmd)
	stderr.Close()
	if err != nil {
		return err
	}
	err = pgserver.WaitAccepting(ctx, "pgbouncer", p.URL(checkDB), pgserver.ReadyTimeout, r.Exited())
	if err == nil {
		p.proc = r
		return nil
	}
	if errors.Is(err, pgserver.ErrExited) {
		<-r.Exited()
		err = fmt.Errorf("%w: %w", err, r.Err())
	}
	_ = r.Kill()
	logs := "pgbouncer log:\n" + pgserver.LogTail(filepath.Join(p.dir, "pgbouncer.log"), 0)
	if tail := pgserver.LogTail(stderrPath, 0); tail != "" {
		logs += "\nstderr:\n" + tail
	}
	return fmt.Errorf("%w\n%s", err, logs)
}

func (p *PgBouncer) close() error {
	var errs []error
	if p.proc != nil {
		errs = append(errs, p.proc.Kill())
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgtest: remove pgbouncer dir: %w", err))
	}
	return errors.Join(errs...)
}
