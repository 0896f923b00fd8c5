"""Test and benchmark support: code the tests and `bench/` use that is not part of the shipped package.

`bench/` scripts put the repository root on `sys.path` to import it; pytest does so itself (tests/ is a
package).
"""
