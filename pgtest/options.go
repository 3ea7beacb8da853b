package pgtest

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// Option configures a server started by [Start] or [NewServer] (or a cluster of
// [StartPatroni]). Options are validated when
// they are applied: an invalid option makes Start return an error (and NewServer fail the
// test) before anything is started. It is an interface, as the library's own option types
// are (fencelock.LessorOption, fencelock.AdvisoryOption): only this package's constructors
// make one.
type Option interface{ applyServer(*config) error }

// serverOption is an Option made of a func.
type serverOption func(*config) error

func (o serverOption) applyServer(c *config) error { return o(c) }

// config is what the options of one [Start] call build.
type config struct {
	settings  []setting
	crashable bool
	archive   bool // WALArchive
	errs      []error
}

// Crashable asks for a server that [Server.Crash] and [Server.Restart] work on: one run from
// local server binaries, even where a Docker daemon answers. With FENCELOCK_TEST_SERVER=docker
// it makes [Start] fail. Fault tests that crash the server pass it.
func Crashable() Option {
	return serverOption(func(c *config) error { c.crashable = true; return nil })
}

// WALArchive gives the server a WAL archive, a fresh directory that its standbys
// ([Server.StartStandby]) share: archive_mode=on, archive_command copying each finished WAL
// segment and history file there, and restore_command reading from it. A standby then knows,
// when it is promoted, every timeline an earlier promotion archived, and numbers its own above
// them, as a shared archive does in production. [Server.WALArchive] returns the directory;
// closing the server removes it. It implies [Crashable] (local binaries).
func WALArchive() Option {
	return serverOption(func(c *config) error { c.archive, c.crashable = true, true; return nil })
}

// setting is one postgresql.conf parameter passed on the server's command line.
type setting = pgserver.Setting

// settingName matches a configuration parameter name, including the two-part names of
// extension ("custom") parameters such as auto_explain.log_min_duration.
var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

// managedSettings are the parameters pgtest sets itself to find and reach the server; changing
// them would break the harness.
var managedSettings = map[string]bool{
	"listen_addresses":        true,
	"port":                    true,
	"unix_socket_directories": true,
	"data_directory":          true,
	"config_file":             true,
	"hba_file":                true,
	"ident_file":              true,
}

// WithSetting sets the postgresql.conf parameter name to value when the server starts, as
// `postgres -c name=value` for a local server and the same flag on the container's command
// line. Settings are applied after pgtest's defaults (fsync=off, full_page_writes=off,
// max_connections=300, shared_buffers=64MB) and in the order given, so a later setting wins,
// e.g. WithSetting("synchronous_commit", "off") or WithSetting("fsync", "on").
//
// The name must be a parameter name (letters, digits, underscores, at most one dot); the
// value must not contain a NUL byte. The parameters pgtest manages itself (listen_addresses,
// port, unix_socket_directories, data_directory, config_file, hba_file, ident_file) are
// refused. A refused setting makes [Start] return an error.
func WithSetting(name, value string) Option {
	return serverOption(func(c *config) error {
		switch {
		case !settingName.MatchString(name):
			return fmt.Errorf("pgtest: WithSetting: invalid parameter name %q", name)
		case managedSettings[strings.ToLower(name)]:
			return fmt.Errorf("pgtest: WithSetting: parameter %q is managed by pgtest", name)
		case strings.ContainsRune(value, 0):
			return fmt.Errorf("pgtest: WithSetting: value of %q contains a NUL byte", name)
		}
		c.settings = append(c.settings, setting{Name: name, Value: value})
		return nil
	})
}

// defaultSettings are passed to every server pgtest starts, before the caller's settings
// (fsync=off, full_page_writes=off, max_connections=300, shared_buffers=64MB).
var defaultSettings = pgserver.DefaultSettings

// AsyncCommit makes synchronous_commit = off the server's default and has the WAL writer wait
// 10 s between flushes (wal_writer_delay), so that a crash loses the WAL of the last
// acknowledged commits: the hazard that fencelock's grants and fences guard against by forcing
// synchronous_commit on for themselves. For crash tests, with [Crashable].
func AsyncCommit() Option {
	return serverOption(func(c *config) error {
		return errors.Join(
			WithSetting("synchronous_commit", "off").applyServer(c),
			WithSetting("wal_writer_delay", "10s").applyServer(c))
	})
}

// parseOptions applies opts to a fresh config and returns it, or every option error joined.
func parseOptions(opts []Option) (config, error) {
	var c config
	for _, opt := range opts {
		if opt == nil {
			c.errs = append(c.errs, errors.New("pgtest: nil Option"))
			continue
		}
		if err := opt.applyServer(&c); err != nil {
			c.errs = append(c.errs, err)
		}
	}
	return c, errors.Join(c.errs...)
}
