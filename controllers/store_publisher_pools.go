package controllers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"k8s.io/apimachinery/pkg/types"
)

// storeKey is one store of one FencedResource.
type storeKey struct {
	resource types.NamespacedName
	store    string
}

// poolKey is one DSN: a key of a Secret at one resourceVersion. The
// FencedResources of a namespace that name the same Secret share its pool,
// so a hundred entries of one database open two connections, not two hundred.
type poolKey struct {
	namespace, secret, key string
}

// storePools keeps a small pool per DSN, replaced when its Secret changes
// (a new resourceVersion) and closed when no store uses it any more.
type storePools struct {
	mu    sync.Mutex
	pools map[poolKey]*storePool
	// users: which pool each store uses.
	users map[storeKey]poolKey
}

type storePool struct {
	resourceVersion string
	pool            *pgxpool.Pool
	users           int
}

// Pool sizes: a publication is one short transaction; connections idle
// longer than storeIdle are closed.
const (
	storeMaxConns = 2
	storeIdle     = time.Minute
)

// get returns the pool of k at resourceVersion rv for user, opening it
// from dsn (and closing the one of an older resourceVersion) as needed.
func (p *storePools) get(user storeKey, k poolKey, rv, dsn string) (*pgxpool.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bind(user, k)
	if cur := p.pools[k]; cur != nil && cur.pool != nil && cur.resourceVersion == rv {
		return cur.pool, nil
	}
	cur := p.pools[k]
	if cur.pool != nil {
		cur.pool.Close()
		cur.pool = nil
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the DSN does not parse") // never echo a DSN: it may hold a password
	}
	cfg.MaxConns, cfg.MinConns, cfg.MaxConnIdleTime = storeMaxConns, 0, storeIdle
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > storeCallTimeout {
		cfg.ConnConfig.ConnectTimeout = storeCallTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	cur.pool, cur.resourceVersion = pool, rv
	return pool, nil
}

// bind makes user a user of k's pool (and no other); p.mu is held.
func (p *storePools) bind(user storeKey, k poolKey) {
	if p.pools == nil {
		p.pools, p.users = map[poolKey]*storePool{}, map[storeKey]poolKey{}
	}
	if had, ok := p.users[user]; ok {
		if had == k {
			return
		}
		p.unbind(user)
	}
	if p.pools[k] == nil {
		p.pools[k] = &storePool{}
	}
	p.users[user] = k
	p.pools[k].users++
}

// unbind drops user, closing its pool when nobody else uses it; p.mu is held.
func (p *storePools) unbind(user storeKey) {
	k, ok := p.users[user]
	if !ok {
		return
	}
	delete(p.users, user)
	sp := p.pools[k]
	if sp.users--; sp.users > 0 {
		return
	}
	if sp.pool != nil {
		sp.pool.Close()
	}
	delete(p.pools, k)
}

// forget drops the stores of resource not named in keep.
func (p *storePools) forget(resource types.NamespacedName, keep func(store string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for u := range p.users {
		if u.resource == resource && !keep(u.store) {
			p.unbind(u)
		}
	}
}

// open is how many pools are open (tests).
func (p *storePools) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, sp := range p.pools {
		if sp.pool != nil {
			n++
		}
	}
	return n
}
