//go:build unix

package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Binaries are the PostgreSQL server programs a local server runs.
type Binaries struct {
	// Dir is the directory holding them (pg_basebackup and pg_ctl are looked for there too).
	Dir string
	// Initdb and Postgres are the paths of the two programs.
	Initdb, Postgres string
}

var (
	binOnce  sync.Once
	bins     Binaries
	binsErr  error
	userOnce sync.Once
	runCred  *syscall.Credential // nil unless the process runs as root
	runErr   error
)

// FindBinaries locates initdb and postgres once per process: in the directory of PG_BIN, else
// on PATH (the postgres next to initdb preferred, Debian symlinks resolved), else in the
// newest /usr/lib/postgresql/<version>/bin (Debian) or /usr/pgsql-<version>/bin (RHEL). It
// returns the first call's result on every call; safe for concurrent use. Errors: PG_BIN set
// to a directory without both programs, or neither program found anywhere.
func FindBinaries() (Binaries, error) {
	binOnce.Do(func() { bins, binsErr = lookBinaries() })
	return bins, binsErr
}

func lookBinaries() (Binaries, error) {
	inDir := func(dir string) (Binaries, bool) {
		b := Binaries{Dir: dir, Initdb: filepath.Join(dir, "initdb"), Postgres: filepath.Join(dir, "postgres")}
		return b, IsExecutable(b.Initdb) && IsExecutable(b.Postgres)
	}
	if dir := os.Getenv(EnvPGBin); dir != "" {
		if b, ok := inDir(dir); ok {
			return b, nil
		}
		return Binaries{}, fmt.Errorf("pgserver: %s=%s does not hold both initdb and postgres", EnvPGBin, dir)
	}
	if initdb, err := exec.LookPath("initdb"); err == nil {
		// Prefer the postgres next to initdb (same version), resolving Debian-style symlinks.
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			if b, ok := inDir(filepath.Dir(real)); ok {
				return b, nil
			}
		}
		if b, ok := inDir(filepath.Dir(initdb)); ok {
			return b, nil
		}
		if postgres, err := exec.LookPath("postgres"); err == nil {
			return Binaries{Dir: filepath.Dir(initdb), Initdb: initdb, Postgres: postgres}, nil
		}
	}
	var dirs []string
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	slices.SortFunc(dirs, func(a, b string) int { return slices.Compare(dirVersion(b), dirVersion(a)) }) // newest first
	for _, dir := range dirs {
		if b, ok := inDir(dir); ok {
			return b, nil
		}
	}
	return Binaries{}, fmt.Errorf("pgserver: initdb and postgres not found in %s, PATH, /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin (install the PostgreSQL server, or set %s)", EnvPGBin, EnvPGBin)
}

// dirVersion extracts the version of a binaries directory: "15" from
// /usr/lib/postgresql/15/bin, "9.6" from /usr/pgsql-9.6/bin.
func dirVersion(dir string) []int {
	base := filepath.Base(filepath.Dir(dir))
	base = strings.TrimPrefix(base, "pgsql-")
	var v []int
	for _, part := range strings.Split(base, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

// IsExecutable reports whether path is a regular file with an execute bit set.
func IsExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// RunAsCredential returns the credential server processes run with: nil when this process
// is not root, else user postgres (or nobody if there is no postgres user), because initdb
// and postgres refuse to run as root. It looks once per process; safe for concurrent use.
// Errors: running as root with neither user.
func RunAsCredential() (*syscall.Credential, error) {
	userOnce.Do(func() {
		if os.Geteuid() != 0 {
			return
		}
		for _, name := range []string{"postgres", "nobody"} {
			u, err := user.Lookup(name)
			if err != nil {
				continue
			}
			uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
			gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
			if err1 != nil || err2 != nil {
				continue
			}
			runCred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
			return
		}
		runErr = errors.New("pgserver: running as root, and neither user postgres nor user nobody exists to run the server as")
	})
	return runCred, runErr
}

// ChownTo gives path to the run-as user cred (see [RunAsCredential]); with a nil cred it
// does nothing. Errors: those of os.Chown.
func ChownTo(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// Command prepares a child process that runs name with args in dir as cred (if not nil), in
// its own process group, killed by SIGKILL if this process dies first (Linux), with PG* and
// locale variables removed from its environment and LC_ALL=C. ctx kills it (pass
// context.Background for one that must outlive the call).
func Command(ctx context.Context, cred *syscall.Credential, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=")
	})
	cmd.Env = append(env, "LC_ALL=C")
	cmd.SysProcAttr = sysProcAttr(cred)
	return cmd
}
