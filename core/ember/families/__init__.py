"""Every kind of model Ember serves, one package each (``ember.families.<name>``).

The registry that lists them in detection order is ``ember.families.registry``; this
package file imports nothing, so importing one family does not import every other.
"""
