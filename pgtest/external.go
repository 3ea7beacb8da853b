package pgtest

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// newExternal returns a Server for the existing server at raw (a postgres:// URL or a
// keyword/value connection string), from FENCELOCK_TEST_DATABASE_URL. Administrative
// statements run in raw's own database; test databases are cloned from a template named
// after a hash of the migrations, so processes with other migrations never share it. It does
// not connect: the first CreateDatabase does.
func newExternal(raw string) (*Server, error) {
	cfg, err := pgx.ParseConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", EnvDatabaseURL, err)
	}
	hash, err := migrationsHash()
	if err != nil {
		return nil, err
	}
	s := &Server{kind: kindExternal, maintDB: cfg.Database, tplName: templateName + "_" + hash}
	if strings.HasPrefix(raw, "postgres://") || strings.HasPrefix(raw, "postgresql://") {
		if s.base, err = url.Parse(raw); err != nil {
			return nil, fmt.Errorf("pgtest: %s: %w", EnvDatabaseURL, err)
		}
	} else {
		s.kv = raw
	}
	return s, nil
}
