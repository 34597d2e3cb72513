package catalog

import (
	resourcev1 "k8s.io/api/resource/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
)

// ListerClaims resolves claims and claim templates through informer listers
// (either may be nil), for callers that watch them already, like the scheduler.
type ListerClaims struct {
	Templates resourcelisters.ResourceClaimTemplateLister
	Claims    resourcelisters.ResourceClaimLister
}

// ResourceClaimTemplate implements ClaimLookup.
func (l ListerClaims) ResourceClaimTemplate(namespace, name string) (*resourcev1.ResourceClaimTemplate, bool) {
	if l.Templates == nil {
		return nil, false
	}
	t, err := l.Templates.ResourceClaimTemplates(namespace).Get(name)
	return t, err == nil
}

// ResourceClaim implements ClaimLookup.
func (l ListerClaims) ResourceClaim(namespace, name string) (*resourcev1.ResourceClaim, bool) {
	if l.Claims == nil {
		return nil, false
	}
	c, err := l.Claims.ResourceClaims(namespace).Get(name)
	return c, err == nil
}
