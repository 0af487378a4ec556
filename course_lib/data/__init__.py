"""Data: the decoded-image cache, image sources, resumable sampling, the DataModules. Imports only
course_lib.base."""
