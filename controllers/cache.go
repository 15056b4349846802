package controllers

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// CacheOptions limits the cache to what the operator needs: ConfigMaps only in
// its own namespace (the trust bundle), never cluster-wide; and of the kinds
// tenants write (LockGrants, FencedResources) and Namespaces, only what the
// operator reads. Every replica caches every LockGrant and FencedResource, so
// whatever a tenant attaches to them would otherwise grow the memory of all
// replicas: 300 LockGrants with 200 KiB annotations each grew one by 170 MiB.
//
// The cached objects are incomplete on purpose. Nothing updates them whole:
// LockGrants are changed by merge patches of the fields the operator sets
// (finalizers, status), FencedResources only through the status subresource
// (which keeps the stored metadata), and Namespaces are patched from a read
// around the cache.
//
// versions, when not nil, keeps the resourceVersion each LockGrant had when
// the cache first received it, for the issuer of the same manager
// (Options.CreationVersions).
func CacheOptions(namespace string, versions *CreationVersions) cache.Options {
	if namespace == "" {
		namespace = locksv1.DefaultNamespace
	}
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}:       {Namespaces: map[string]cache.Config{namespace: {}}},
			&locksv1.LockGrant{}:      {Transform: versions.transform},
			&locksv1.FencedResource{}: {Transform: boundFencedResource},
			&corev1.Namespace{}:       {Transform: boundNamespace},
		},
		// Nothing here reads managedFields; at 10,000 entries with grants
		// they are a large part of what the cache holds.
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// The transforms below modify and return the object the informer decoded
// (no copy: it is not shared yet); any other type passes unchanged.

// boundLockGrant keeps of a LockGrant its spec, status, finalizers (the
// operator patches them) and the unresolved-mutation record, the record only
// up to locksv1.MaxUnresolvedMutationBytes: a longer one (stored through
// break-glass or before the webhook checked records) becomes a marker of its
// size that readRecord reports.
func boundLockGrant(obj any) (any, error) {
	lg, ok := obj.(*locksv1.LockGrant)
	if !ok {
		return obj, nil
	}
	dropUnread(&lg.ObjectMeta)
	lg.Annotations = keepRecord(lg.Annotations)
	return lg, nil
}

// boundFencedResource keeps of a FencedResource its spec and status: no
// label, annotation or finalizer of it is read.
func boundFencedResource(obj any) (any, error) {
	fr, ok := obj.(*locksv1.FencedResource)
	if !ok {
		return obj, nil
	}
	dropUnread(&fr.ObjectMeta)
	fr.Annotations, fr.Finalizers = nil, nil
	return fr, nil
}

// boundNamespace keeps of a Namespace the enrollment label, its only label
// or annotation the operator reads.
func boundNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	enrolled, isSet := ns.Labels[locksv1.LabelEnrolledNamespace]
	dropUnread(&ns.ObjectMeta)
	ns.Annotations = nil
	if isSet {
		ns.Labels = map[string]string{locksv1.LabelEnrolledNamespace: enrolled}
	}
	return ns, nil
}

// dropUnread clears the metadata no reader of the cache uses.
func dropUnread(m *metav1.ObjectMeta) {
	m.ManagedFields, m.Labels, m.OwnerReferences = nil, nil, nil
}

// keepRecord returns only the unresolved-mutation record of annotations
// (nil without one), a record over the bound replaced by its marker.
func keepRecord(annotations map[string]string) map[string]string {
	raw, ok := annotations[locksv1.AnnotationUnresolvedMutation]
	if !ok {
		return nil
	}
	if len(raw) > locksv1.MaxUnresolvedMutationBytes {
		raw = oversizedRecord(len(raw))
	}
	return map[string]string{locksv1.AnnotationUnresolvedMutation: raw}
}

// oversizedRecordPrefix starts the marker the cache keeps instead of a record
// over the bound. No record starts so: a record is a JSON object.
const oversizedRecordPrefix = "<record over "

func oversizedRecord(size int) string {
	return fmt.Sprintf("%s%d bytes: %d bytes>", oversizedRecordPrefix, locksv1.MaxUnresolvedMutationBytes, size)
}

// readRecord reads a LockGrant's unresolved-mutation value as cached: the
// marker of an oversized record is reported as such.
func readRecord(raw string) (locksv1.UnresolvedMutation, error) {
	if strings.HasPrefix(raw, oversizedRecordPrefix) {
		return locksv1.UnresolvedMutation{}, fmt.Errorf("%w: %s, not kept in the operator's cache",
			locksv1.ErrBadUnresolvedMutation, strings.Trim(raw, "<>"))
	}
	return locksv1.ParseUnresolvedMutation(raw)
}
