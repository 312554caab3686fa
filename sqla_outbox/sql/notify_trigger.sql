CREATE TRIGGER outbox_notify AFTER INSERT ON %(fullname)s
FOR EACH STATEMENT EXECUTE FUNCTION %(fullname)s_notify()
