package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// version is one revision of an object as etcd stored it.
type version struct {
	rev          int64
	deleted      bool
	annotations  map[string]string
	spec, status map[string]any // custom resources only
}

// etcdClient connects to all three members (the checker reads etcd
// directly: it trusts neither the API server's watch cache nor the operator).
func (c *Cluster) etcdClient() (*clientv3.Client, error) {
	var eps []string
	for i := 0; i < 3; i++ {
		eps = append(eps, "http://"+c.net.subnet(etcdHost+i)+":2379")
	}
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
}

// etcdHistory reads every revision of every key under prefix (the API
// servers compact nothing here).
func etcdHistory(ctx context.Context, cli *clientv3.Client, prefix string) (map[string][]version, error) {
	cur, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	out := map[string][]version{}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	watch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1))
	// A progress notification comes once the watcher has caught up; the
	// first at or past the revision read above ends the history.
	go func() {
		for wctx.Err() == nil {
			_ = cli.RequestProgress(wctx)
			_ = ctxtime.Sleep(wctx, 100*time.Millisecond)
		}
	}()
	for resp := range watch {
		if err := resp.Err(); err != nil {
			return nil, fmt.Errorf("etcd history of %s: %w", prefix, err)
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			v := version{rev: ev.Kv.ModRevision, deleted: ev.Type == clientv3.EventTypeDelete}
			if !v.deleted {
				if v.annotations, v.spec, v.status, err = decode(ev.Kv.Value); err != nil {
					return nil, fmt.Errorf("%s@%d: %w", key, ev.Kv.ModRevision, err)
				}
			}
			out[key] = append(out[key], v)
		}
		if resp.IsProgressNotify() && resp.Header.Revision >= cur.Header.Revision {
			return out, nil
		}
	}
	return nil, fmt.Errorf("etcd history of %s: not complete after 60s: %w", prefix, wctx.Err())
}

// decode reads an object as stored: JSON (custom resources) or the API
// server's protobuf envelope (core kinds).
func decode(raw []byte) (annotations map[string]string, spec, status map[string]any, err error) {
	if strings.HasPrefix(string(raw), "k8s\x00") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return nil, nil, nil, fmt.Errorf("unexpected %T", obj)
		}
		return cm.Annotations, nil, nil, nil
	}
	var u struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec   map[string]any `json:"spec"`
		Status map[string]any `json:"status"`
	}
	if err := json.Unmarshal(raw, &u); err != nil {
		return nil, nil, nil, err
	}
	return u.Metadata.Annotations, u.Spec, u.Status, nil
}

// readEvents reads every worker's event log of a schedule.
func readEvents(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var out []Event
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e Event
			if json.Unmarshal(sc.Bytes(), &e) == nil { // a line cut by SIGKILL is skipped
				out = append(out, e)
			}
		}
		fh.Close()
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}
