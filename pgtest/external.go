package pgtest

import (
	"fmt"

	"github.com/fencelock/fencelock/internal/pgserver"
)

// newExternal returns a Server for the existing server at raw (a postgres:// URL or a
// keyword/value connection string), from FENCELOCK_TEST_DATABASE_URL. Administrative
// statements run in raw's own database; test databases are cloned from a template named
// after a hash of the migrations, so processes with other migrations never share it. It does
// not connect: the first CreateDatabase does.
func newExternal(raw string) (*Server, error) {
	addr, maintDB, err := pgserver.ParseAddr(raw)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %s: %w", EnvDatabaseURL, err)
	}
	hash, err := pgserver.MigrationsHash()
	if err != nil {
		return nil, err
	}
	return &Server{kind: kindExternal, base: addr.Base, kv: addr.KV, maintDB: maintDB, tplName: templateName + "_" + hash}, nil
}
