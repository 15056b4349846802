// Package v1alpha1 contains the fencekeeper API: FencedResource, the canonical
// registry entry of one protected resource, and LockGrant, one acquisition
// attempt and, once issued, its signed grant.
//
// +kubebuilder:object:generate=true
// +groupName=locks.fencekeeper.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "locks.fencekeeper.dev", Version: "v1alpha1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
